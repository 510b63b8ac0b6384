-- A compute's name (Neon's endpoint name: neonctl's add-compute --name): a label kept with it,
-- shown back, changed with a PATCH; not unique, and the endpoint's id still names it in hosts.

ALTER TABLE endpoints ADD COLUMN name TEXT;
