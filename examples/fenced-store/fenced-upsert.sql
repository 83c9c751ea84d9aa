-- The protected rows carry the highest fencing token written to them; a write names the writer's token and
-- changes nothing when a higher one was written before. PostgreSQL (9.5 and later) and SQLite (3.24 and later);
-- :name, :body and :token are the statement's parameters (SQLite's named style; $1, $2 and $3 with PostgreSQL's
-- drivers). Bind them, never paste them in.
CREATE TABLE IF NOT EXISTS reports (
  name TEXT PRIMARY KEY,
  body TEXT NOT NULL,
  fencing_token BIGINT NOT NULL
);

-- One row changed: written. No row changed: a later holder has written; stop.
INSERT INTO reports (name, body, fencing_token) VALUES (:name, :body, :token)
  ON CONFLICT (name) DO UPDATE SET body = excluded.body, fencing_token = excluded.fencing_token
  WHERE reports.fencing_token <= excluded.fencing_token;
