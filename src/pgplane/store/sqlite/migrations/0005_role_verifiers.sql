-- The SCRAM verifiers of login roles made with SQL on a branch's compute, synced from it when it
-- applies config or suspends (and read from it when it runs), so the proxy authenticates those
-- roles itself and a wrong password never wakes a compute. Platform-managed roles are in roles.

CREATE TABLE role_verifiers (
    branch_id TEXT NOT NULL,
    name TEXT NOT NULL,
    verifier TEXT NOT NULL,
    PRIMARY KEY (branch_id, name)
);
