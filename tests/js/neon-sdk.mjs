// Neon's TypeScript SDK, @neon/sdk 6 (the one the neon and neonctl CLIs ship), used as its
// README shows: a client that throws and waits for the operations of what it changes.
//
// node neon-sdk.mjs restore-snapshot; NEON_SDK names the SDK's entry (dist/index.js); the rest
// from the environment. Prints one JSON object.
const env = process.env;
const { createNeonClient } = await import(env.NEON_SDK);
const neon = createNeonClient({
  apiKey: env.NEON_API_KEY,
  baseUrl: env.API_HOST,
  throwOnError: true,
  waitForReadiness: true,
});

async function restoreSnapshot() {
  const projectId = env.PROJECT_ID;
  const snapshot = await neon.snapshots.create({ projectId, branchId: env.BRANCH_ID, name: "sdk" });
  // No target: the SDK finalizes at once ("as a new branch: ready to use").
  const restored = await neon.snapshots.restore({ projectId, snapshotId: snapshot.id });
  const branches = await neon.branches.list({ projectId }).all();
  const operations = await neon.operations.list({ projectId }).all();
  return { snapshot, restored, branches, operations };
}

const commands = { "restore-snapshot": restoreSnapshot };
console.log(JSON.stringify(await commands[process.argv[2]]()));
