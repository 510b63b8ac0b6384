// Loaded into Neon's MCP server with `node --import` (NODE_OPTIONS, as an MCP client's "env" can
// set it). The server's SQL tools call the driver's `neon(uri)` with the URI the API returns, and
// `neon()` posts to `https://api.<host minus its first label>/sql` on port 443; the server has no
// setting for that. This machine resolves no `*.localhost` name and the test server's proxy is not
// on 443, so the one line the driver's documentation gives for such a setup is set here, on the
// very module instance the server imports (PGPLANE_MCP_DRIVER: its file URL). Nothing else of the
// server or the driver is changed.
const { neonConfig } = await import(process.env.PGPLANE_MCP_DRIVER);
neonConfig.fetchEndpoint = process.env.PGPLANE_MCP_FETCH_ENDPOINT;
