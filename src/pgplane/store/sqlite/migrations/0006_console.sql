-- The web console: accounts sign in with a password (an argon2id hash), sessions are cookies
-- (only their digest is kept, with the CSRF token their forms carry), and a new account comes
-- from a one-time sign-up link (only its digest is kept; an invitation names its email).

ALTER TABLE accounts ADD COLUMN password_hash TEXT;

CREATE TABLE console_sessions (
    digest      TEXT PRIMARY KEY,
    account_id  TEXT NOT NULL REFERENCES accounts(id),
    csrf_token  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX console_sessions_by_account ON console_sessions (account_id);

CREATE TABLE signup_tokens (
    digest      TEXT PRIMARY KEY,
    email       TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
