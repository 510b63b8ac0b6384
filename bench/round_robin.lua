-- wrk: each thread's connections go to the next of the addresses in $PGPLANE_BENCH_PORTS (on
-- 127.0.0.1), in turn: the connection-level round-robin of a layer-4 load balancer.
local ports = {}
for port in string.gmatch(os.getenv("PGPLANE_BENCH_PORTS") or "", "%d+") do
   table.insert(ports, port)
end
local next_one = 0

function setup(thread)
   local port = ports[next_one % #ports + 1]
   next_one = next_one + 1
   thread.addr = wrk.lookup("127.0.0.1", port)[1]
end
