// The API calls Neon's pull-request actions make, made the same way: through Neon's own
// TypeScript client (@neondatabase/api-client), in the actions' order and with their arguments
// (create-branch-action 6: find the branch by name, else create it with its annotations and
// expiry; then its endpoint, database, role and password. schema-diff-action 1: both
// branches' schemas, compared. delete-branch-action 3: find by name, delete). The actions'
// own code is not published where CI can fetch it; these are pgplane's words for their calls.
//
// node preview-actions.cjs <create|schema-diff|delete>; inputs from the environment, as the
// runner passes an action's inputs. Prints one JSON object.
const { createApiClient } = require("@neondatabase/api-client");

const env = process.env;
const client = createApiClient({
  apiKey: env.NEON_API_KEY,
  baseURL: env.API_HOST,
  timeout: 60000,
  headers: { "User-Agent": "pgplane-tests preview-actions" },
});

async function find(projectId, identifier) {
  const r = await client.listProjectBranches({ projectId, search: identifier, limit: 10000 });
  return r.data.branches.find((b) => b.name === identifier || b.id === identifier);
}

async function create() {
  const projectId = env.PROJECT_ID;
  const existing = await find(projectId, env.BRANCH_NAME);
  let branch;
  let created = false;
  if (existing) {
    branch = existing;
  } else {
    const parent = env.PARENT_BRANCH ? await find(projectId, env.PARENT_BRANCH) : undefined;
    if (env.PARENT_BRANCH && !parent) throw new Error(`Parent branch ${env.PARENT_BRANCH} not found`);
    const annotations = JSON.parse(env.ANNOTATIONS || "{}");
    const r = await client.createProjectBranch(projectId, {
      endpoints: [{ type: "read_write", suspend_timeout_seconds: Number(env.SUSPEND_TIMEOUT || 0) }],
      branch: {
        name: env.BRANCH_NAME,
        parent_id: parent ? parent.id : undefined,
        init_source: env.SCHEMA_ONLY === "true" ? "schema-only" : undefined,
        expires_at: env.EXPIRES_AT || undefined,
      },
      annotation_value: annotations,
    });
    branch = r.data.branch;
    created = true;
  }
  const endpoints = await client.listProjectBranchEndpoints(projectId, branch.id);
  if (endpoints.data.endpoints.length === 0) throw new Error("No endpoints found for branch");
  const endpoint = endpoints.data.endpoints[0];
  await client.getProjectBranchDatabase(projectId, branch.id, env.DATABASE);
  await client.getProjectBranchRole(projectId, branch.id, env.ROLE);
  const password = (await client.getProjectBranchRolePassword(projectId, branch.id, env.ROLE)).data
    .password;
  const url = new URL(`postgresql://${endpoint.host}`);
  url.pathname = env.DATABASE;
  url.username = env.ROLE;
  url.password = password;
  url.searchParams.set("sslmode", "require");
  const pooled = new URL(url.toString());
  pooled.hostname = endpoint.host.replace(endpoint.id, `${endpoint.id}-pooler`);
  return {
    branch_id: branch.id,
    created,
    expires_at: branch.expires_at || null,
    init_source: branch.init_source || null,
    db_url: url.toString(),
    db_url_pooled: pooled.toString(),
  };
}

async function schemaDiff() {
  const projectId = env.PROJECT_ID;
  const branches = (await client.listProjectBranches({ projectId })).data.branches;
  const compare = branches.find((b) => b.id === env.COMPARE_BRANCH || b.name === env.COMPARE_BRANCH);
  if (!compare) throw new Error(`Branch ${env.COMPARE_BRANCH} not found`);
  const base = env.BASE_BRANCH
    ? branches.find((b) => b.id === env.BASE_BRANCH || b.name === env.BASE_BRANCH)
    : branches.find((b) => b.id === compare.parent_id);
  if (!base) throw new Error("no base branch");
  const schema = async (branchId) =>
    (await client.getProjectBranchSchema({ projectId, branchId, role: env.ROLE, db_name: env.DATABASE }))
      .data.sql;
  const [compareSql, baseSql] = [await schema(compare.id), await schema(base.id)];
  return { same: compareSql === baseSql, compare: compareSql, base: baseSql, base_id: base.id };
}

async function remove() {
  const branch = await find(env.PROJECT_ID, env.BRANCH);
  if (!branch) throw new Error(`Branch ${env.BRANCH} not found`);
  const r = await client.deleteProjectBranch({ projectId: env.PROJECT_ID, branchId: branch.id });
  return { status: r.status, deleted: branch.id, operations: r.data.operations.map((o) => o.action) };
}

const steps = { create, "schema-diff": schemaDiff, delete: remove };
steps[process.argv[2]]()
  .then((out) => console.log(JSON.stringify(out)))
  .catch((e) => {
    console.error(e.response ? `${e.config.method} ${e.config.url}: ${JSON.stringify(e.response.data)}` : e);
    process.exit(1);
  });
