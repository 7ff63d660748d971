-- tenure's tables and functions on PostgreSQL, schema version 1.
--
-- tenure runs this itself, once, when it finds no tenure_meta table and its
-- role may create tables in the first schema of its search_path. A role
-- that may not (least privilege) needs an owner to run this file first,
-- then the grants at its end (the book's PostgreSQL page).
--
-- Every operation is one function call, an autocommit statement: it works
-- through a pooler in transaction mode, and no session state (no session
-- advisory lock, no prepared statement) is relied on. Times are the
-- server's clock (clock_timestamp()), in milliseconds since the Unix epoch.
--
-- The functions that read tables plan each statement at each call
-- (plan_cache_mode = force_custom_plan): a plan a session cached while a
-- table was small scans the whole table once it has grown (10,000
-- partitions took seconds an acquisition) until an ANALYZE, up to a
-- minute later.
--
-- A function that writes an election's rows first locks its anchor row in
-- tenure_elections (token counter and epoch), created if missing, then its
-- lease row, and reads the clock after both: the operations on one
-- election run one at a time, each at a later instant than the one before.

CREATE TABLE IF NOT EXISTS tenure_meta (
  key text PRIMARY KEY,
  value text NOT NULL
);

-- An election's anchor: the last token issued (tokens rise across terms),
-- and the server process ("system id:postmaster start") its rows were
-- first served by, since when, and the largest ttl granted since.
CREATE TABLE IF NOT EXISTS tenure_elections (
  prefix text NOT NULL,
  name text NOT NULL,
  last_token bigint NOT NULL,
  epoch text,
  epoch_since_ms bigint,
  epoch_ttl_ms bigint,
  PRIMARY KEY (prefix, name)
);

CREATE TABLE IF NOT EXISTS tenure_leases (
  prefix text NOT NULL,
  name text NOT NULL,
  owner text NOT NULL,
  attempt text NOT NULL,
  token bigint NOT NULL,
  ttl_ms bigint NOT NULL,
  expires_ms bigint NOT NULL,
  since_ms bigint NOT NULL,
  PRIMARY KEY (prefix, name)
);

-- The term that holds (or held) the lease, renewed with it and deleted
-- only by its holder's release: while it lives without its lease, the
-- lease vanished some other way (deleted by hand) and its holder may
-- still act, so nobody is elected until it expires.
CREATE TABLE IF NOT EXISTS tenure_witnesses (
  prefix text NOT NULL,
  name text NOT NULL,
  owner text NOT NULL,
  token bigint NOT NULL,
  expires_ms bigint NOT NULL,
  PRIMARY KEY (prefix, name)
);

CREATE TABLE IF NOT EXISTS tenure_members (
  prefix text NOT NULL,
  grp text NOT NULL,
  member text NOT NULL,
  expires_ms bigint NOT NULL,
  PRIMARY KEY (prefix, grp, member)
);

CREATE TABLE IF NOT EXISTS tenure_runs (
  prefix text NOT NULL,
  name text NOT NULL,
  token bigint NOT NULL,
  at_ms bigint NOT NULL,
  keep_until_ms bigint NOT NULL,
  slot bigint,
  PRIMARY KEY (prefix, name)
);
-- The last scheduled slot claimed; missing in tables made before slots.
ALTER TABLE tenure_runs ADD COLUMN IF NOT EXISTS slot bigint;

-- The server's clock, in ms.
CREATE OR REPLACE FUNCTION tenure_now() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

-- Which server process, and which copy of the lease tables, serve the
-- rows: a restart (with or without the data it had), a restore and a
-- failover to a replica change the process; a TRUNCATE, or tables dropped
-- and made again (a pg_restore --clean), change the tables' files. The
-- process is kept in the backend's own setting once read (a backend never
-- changes its postmaster, and pg_control_system() reads a file); the
-- files are looked up at each call.
CREATE OR REPLACE FUNCTION tenure_epoch() RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  process text := current_setting('tenure.process', true);
BEGIN
  IF process IS NULL OR process = '' THEN
    process := (SELECT system_identifier::text FROM pg_control_system()) || ':' ||
      floor(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text;
    PERFORM set_config('tenure.process', process, false);
  END IF;
  RETURN process || ':' || pg_relation_filenode('tenure_leases')::text || ':' ||
    pg_relation_filenode('tenure_witnesses')::text;
END
$$;

-- An acknowledged write of tenure's must survive a crash of the server
-- (a crash restart keeps the postmaster, and so the epoch): with
-- synchronous_commit off, the commits of the last moments are lost.
-- Raised to local (flushed before the reply) for the transaction only.
CREATE OR REPLACE FUNCTION tenure_durable() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF current_setting('synchronous_commit') = 'off' THEN
    PERFORM set_config('synchronous_commit', 'local', true);
  END IF;
END
$$;

-- A hint for followers: kind (acquired, released, renewed), prefix, name,
-- and the ttl a renewal set.
CREATE OR REPLACE FUNCTION tenure_announce(p_kind text, p_prefix text, p_name text, p_ttl bigint)
RETURNS void LANGUAGE sql VOLATILE AS $$
  SELECT pg_notify('tenure', json_build_array(p_kind, p_prefix, p_name, p_ttl)::text)
$$;

-- When server process p_epoch first served tenure (recorded now, at
-- now_ms, if it had not): every call that finds or keeps a lease records
-- it, so that the hold-off of a restarted server counts from when it came
-- back, not from the first election that fell free afterwards.
CREATE OR REPLACE FUNCTION tenure_served(p_epoch text, p_now bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  since bigint;
  known text := current_setting('tenure.served', true);
BEGIN
  -- Once this backend has seen the row of its epoch, it stays.
  IF known IS NOT NULL AND split_part(known, '|', 1) = p_epoch THEN
    RETURN split_part(known, '|', 2)::bigint;
  END IF;
  SELECT m.value::bigint INTO since FROM tenure_meta AS m
    WHERE m.key = 'epoch_since:' || p_epoch;
  IF since IS NULL THEN
    INSERT INTO tenure_meta AS m (key, value) VALUES ('epoch_since:' || p_epoch, p_now::text)
      ON CONFLICT (key) DO NOTHING;
    DELETE FROM tenure_meta AS m
      WHERE m.key LIKE 'epoch_since:%' AND m.key <> 'epoch_since:' || p_epoch;
    SELECT m.value::bigint INTO since FROM tenure_meta AS m
      WHERE m.key = 'epoch_since:' || p_epoch;
  END IF;
  IF since IS NOT NULL THEN
    PERFORM set_config('tenure.served', p_epoch || '|' || since::text, false);
  END IF;
  RETURN coalesce(since, p_now);
END
$$;

-- Acquire the lease of one election, or say who holds it (outcome 0), or
-- that nobody may be granted it for ttl_left ms yet (outcome 2: the
-- hold-off of a server process new to the election, or a lease that
-- vanished without its holder's release); outcome 1: won, a new term or
-- the lease this same attempt wrote before its reply was lost.
--
-- The token is above every earlier one: max(last + 1, the server's clock
-- in ms, the replaced lease's and witness's + 1), so a restore from an
-- older copy (an older counter) still issues rising tokens.
CREATE OR REPLACE FUNCTION tenure_acquire(
  p_prefix text, p_name text, p_id text, p_attempt text, p_ttl bigint, p_hold_off bigint,
  p_ignore_epoch boolean)
RETURNS TABLE (outcome int, token bigint, owner text, ttl_left bigint, since_ms bigint,
  attempt text, lease_ttl bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  e tenure_elections%ROWTYPE;
  l tenure_leases%ROWTYPE;
  w tenure_witnesses%ROWTYPE;
  now_ms bigint;
  current_epoch text := tenure_epoch();
  store_since bigint;
  hold bigint := greatest(p_ttl, p_hold_off);
  wait bigint;
  new_token bigint;
BEGIN
  PERFORM tenure_durable();
  -- Recorded before any row of the election is locked: every function
  -- takes the meta row first, so none waits for it while holding another.
  store_since := tenure_served(current_epoch, tenure_now());
  INSERT INTO tenure_elections AS t (prefix, name, last_token)
    VALUES (p_prefix, p_name, 0) ON CONFLICT DO NOTHING;
  SELECT * INTO e FROM tenure_elections AS t
    WHERE t.prefix = p_prefix AND t.name = p_name FOR UPDATE;
  SELECT * INTO l FROM tenure_leases AS t
    WHERE t.prefix = p_prefix AND t.name = p_name FOR UPDATE;
  SELECT * INTO w FROM tenure_witnesses AS t
    WHERE t.prefix = p_prefix AND t.name = p_name FOR UPDATE;
  now_ms := tenure_now();

  IF l.owner IS NOT NULL AND l.expires_ms > now_ms
      AND NOT (l.owner = p_id AND l.attempt = p_attempt) THEN
    RETURN QUERY SELECT 0, l.token, l.owner, l.expires_ms - now_ms, l.since_ms, l.attempt,
      l.ttl_ms;
    RETURN;
  END IF;

  -- The hold-off: when the server process is new to the election, a
  -- leader from before may hold a lease this server lost (a crash that
  -- lost commits, a restore, a failover to a replica), with a ttl up to
  -- the largest in use. For a name new to the process, the period counts
  -- from when the process first served any election.
  IF NOT p_ignore_epoch THEN
    IF e.epoch IS DISTINCT FROM current_epoch THEN
      e.epoch := current_epoch;
      e.epoch_since_ms := store_since;
      e.epoch_ttl_ms := greatest(coalesce(e.epoch_ttl_ms, 0), hold);
      UPDATE tenure_elections AS t SET epoch = e.epoch, epoch_since_ms = e.epoch_since_ms,
        epoch_ttl_ms = e.epoch_ttl_ms WHERE t.prefix = p_prefix AND t.name = p_name;
    END IF;
    wait := e.epoch_since_ms + greatest(e.epoch_ttl_ms, hold) - now_ms;
    IF wait > 0 THEN
      RETURN QUERY SELECT 2, 0::bigint, ''::text, wait, 0::bigint, ''::text, 0::bigint;
      RETURN;
    END IF;
  END IF;

  IF l.owner IS NOT NULL AND l.expires_ms > now_ms THEN
    -- Our own attempt's lease, whose reply was lost: adopt it.
    UPDATE tenure_leases AS t SET expires_ms = now_ms + p_ttl, ttl_ms = p_ttl
      WHERE t.prefix = p_prefix AND t.name = p_name;
    INSERT INTO tenure_witnesses AS t (prefix, name, owner, token, expires_ms)
      VALUES (p_prefix, p_name, p_id, l.token, now_ms + p_ttl)
      ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
        expires_ms = excluded.expires_ms;
    RETURN QUERY SELECT 1, l.token, l.owner, p_ttl, l.since_ms, l.attempt, p_ttl;
    RETURN;
  END IF;

  -- Only the holder's release deletes the witness: a lease that vanished
  -- any other way counts as a crash.
  IF w.owner IS NOT NULL AND w.expires_ms > now_ms THEN
    RETURN QUERY SELECT 2, 0::bigint, ''::text, w.expires_ms - now_ms, 0::bigint, ''::text,
      0::bigint;
    RETURN;
  END IF;

  new_token := greatest(e.last_token + 1, now_ms, coalesce(l.token, 0) + 1,
    coalesce(w.token, 0) + 1);
  UPDATE tenure_elections AS t SET last_token = new_token,
    epoch_ttl_ms = greatest(coalesce(t.epoch_ttl_ms, 0), p_ttl)
    WHERE t.prefix = p_prefix AND t.name = p_name;
  INSERT INTO tenure_leases AS t (prefix, name, owner, attempt, token, ttl_ms, expires_ms, since_ms)
    VALUES (p_prefix, p_name, p_id, p_attempt, new_token, p_ttl, now_ms + p_ttl, now_ms)
    ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, attempt = excluded.attempt,
      token = excluded.token, ttl_ms = excluded.ttl_ms, expires_ms = excluded.expires_ms,
      since_ms = excluded.since_ms;
  INSERT INTO tenure_witnesses AS t (prefix, name, owner, token, expires_ms)
    VALUES (p_prefix, p_name, p_id, new_token, now_ms + p_ttl)
    ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
      expires_ms = excluded.expires_ms;
  PERFORM tenure_announce('acquired', p_prefix, p_name, p_ttl);
  RETURN QUERY SELECT 1, new_token, p_id, p_ttl, now_ms, p_attempt, p_ttl;
END
$$;

-- Renew term (id, token): outcome 1, or 0 with the lease's holder (owner
-- NULL when nobody holds it).
CREATE OR REPLACE FUNCTION tenure_renew(
  p_prefix text, p_name text, p_id text, p_token bigint, p_ttl bigint, p_announce boolean)
RETURNS TABLE (outcome int, token bigint, owner text, ttl_left bigint, since_ms bigint,
  attempt text, lease_ttl bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  l tenure_leases%ROWTYPE;
  expires bigint;
  now_ms bigint;
BEGIN
  PERFORM tenure_durable();
  PERFORM tenure_served(tenure_epoch(), tenure_now());
  -- The clock is read in the statement, after the row is locked (and read
  -- again if another transaction changed the row meanwhile).
  UPDATE tenure_leases AS t SET expires_ms = tenure_now() + p_ttl, ttl_ms = p_ttl
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.owner = p_id AND t.token = p_token
      AND t.expires_ms > tenure_now()
    RETURNING t.expires_ms INTO expires;
  IF expires IS NOT NULL THEN
    INSERT INTO tenure_witnesses AS t (prefix, name, owner, token, expires_ms)
      VALUES (p_prefix, p_name, p_id, p_token, expires)
      ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
        expires_ms = excluded.expires_ms;
    IF p_announce THEN
      PERFORM tenure_announce('renewed', p_prefix, p_name, p_ttl);
    END IF;
    RETURN QUERY SELECT 1, p_token, p_id, p_ttl, 0::bigint, ''::text, p_ttl;
    RETURN;
  END IF;
  now_ms := tenure_now();
  SELECT * INTO l FROM tenure_leases AS t WHERE t.prefix = p_prefix AND t.name = p_name;
  IF l.owner IS NOT NULL AND l.expires_ms > now_ms THEN
    RETURN QUERY SELECT 0, l.token, l.owner, l.expires_ms - now_ms, l.since_ms, l.attempt,
      l.ttl_ms;
  ELSE
    RETURN QUERY SELECT 0, 0::bigint, NULL::text, 0::bigint, 0::bigint, ''::text, 0::bigint;
  END IF;
END
$$;

-- Renew many terms of instance id under one prefix (a partition set's):
-- one statement for the leases, one for their witnesses. Returns the
-- names renewed; the caller asks tenure_renew about the others.
CREATE OR REPLACE FUNCTION tenure_renew_many(
  p_prefix text, p_id text, p_ttl bigint, p_names text[], p_tokens bigint[])
RETURNS TABLE (renewed_name text)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
BEGIN
  PERFORM tenure_durable();
  PERFORM tenure_served(tenure_epoch(), tenure_now());
  RETURN QUERY
  WITH renewed AS (
    UPDATE tenure_leases AS t SET expires_ms = tenure_now() + p_ttl, ttl_ms = p_ttl
      FROM unnest(p_names, p_tokens) AS g(name, token)
      WHERE t.prefix = p_prefix AND t.name = g.name AND t.token = g.token AND t.owner = p_id
        AND t.expires_ms > tenure_now()
      RETURNING t.name, t.token, t.expires_ms
  ), witnessed AS (
    INSERT INTO tenure_witnesses AS w (prefix, name, owner, token, expires_ms)
      SELECT p_prefix, r.name, p_id, r.token, r.expires_ms FROM renewed AS r
      ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
        expires_ms = excluded.expires_ms
      RETURNING w.name
  )
  SELECT r.name FROM renewed AS r;
END
$$;

-- The holder's release: of its lease, or, when the lease vanished some
-- other way, of its witness alone. True only if the lease was ours.
CREATE OR REPLACE FUNCTION tenure_resign(p_prefix text, p_name text, p_id text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  expires bigint;
BEGIN
  PERFORM tenure_durable();
  DELETE FROM tenure_leases AS t
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.owner = p_id AND t.token = p_token
    RETURNING t.expires_ms INTO expires;
  DELETE FROM tenure_witnesses AS t
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.owner = p_id AND t.token = p_token;
  -- Only a lease's release is announced: after a lease deleted by hand,
  -- followers wait for the witness to run out, as for a crash.
  IF expires IS NOT NULL THEN
    PERFORM tenure_announce('released', p_prefix, p_name, 0);
  END IF;
  RETURN expires IS NOT NULL AND expires > tenure_now();
END
$$;

-- The live lease of an election, if any.
CREATE OR REPLACE FUNCTION tenure_inspect(p_prefix text, p_name text)
RETURNS TABLE (token bigint, owner text, ttl_left bigint, since_ms bigint, attempt text,
  lease_ttl bigint)
LANGUAGE sql VOLATILE AS $$
  SELECT t.token, t.owner, t.expires_ms - n.now_ms, t.since_ms, t.attempt, t.ttl_ms
    FROM tenure_leases AS t, (SELECT tenure_now() AS now_ms) AS n
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.expires_ms > n.now_ms
$$;

-- A partition-set member's heartbeat (p_join) or farewell; the live
-- members, sorted.
CREATE OR REPLACE FUNCTION tenure_heartbeat(
  p_prefix text, p_group text, p_member text, p_ttl bigint, p_join boolean)
RETURNS text[]
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  now_ms bigint := tenure_now();
  live text[];
BEGIN
  DELETE FROM tenure_members AS t
    WHERE t.prefix = p_prefix AND t.grp = p_group AND t.expires_ms <= now_ms;
  IF p_join THEN
    INSERT INTO tenure_members AS t (prefix, grp, member, expires_ms)
      VALUES (p_prefix, p_group, p_member, now_ms + p_ttl)
      ON CONFLICT (prefix, grp, member) DO UPDATE SET expires_ms = excluded.expires_ms;
  ELSE
    DELETE FROM tenure_members AS t
      WHERE t.prefix = p_prefix AND t.grp = p_group AND t.member = p_member;
  END IF;
  SELECT coalesce(array_agg(t.member ORDER BY t.member), '{}') INTO live
    FROM tenure_members AS t WHERE t.prefix = p_prefix AND t.grp = p_group;
  RETURN live;
END
$$;

-- How long ago the last run was recorded (ms), by the server's clock,
-- and the last scheduled slot claimed (ms since the Unix epoch, or null).
CREATE OR REPLACE FUNCTION tenure_run_marker(p_prefix text, p_name text)
RETURNS TABLE (age_ms bigint, slot bigint)
LANGUAGE sql VOLATILE AS $$
  SELECT greatest(n.now_ms - t.at_ms, 0), t.slot
    FROM tenure_runs AS t, (SELECT tenure_now() AS now_ms) AS n
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.keep_until_ms > n.now_ms
$$;

-- Record a run now, only by the term holding the lease, never over a
-- newer term's record; with a slot (not null), only if it is later than
-- the slot recorded. A record without a slot keeps the recorded one.
CREATE OR REPLACE FUNCTION tenure_record_run(
  p_prefix text, p_name text, p_id text, p_token bigint, p_keep bigint, p_slot bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  now_ms bigint;
  held boolean;
  newer boolean;
  kept_slot bigint;
BEGIN
  PERFORM 1 FROM tenure_leases AS t
    WHERE t.prefix = p_prefix AND t.name = p_name FOR SHARE;
  now_ms := tenure_now();
  SELECT true INTO held FROM tenure_leases AS t
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.owner = p_id AND t.token = p_token
      AND t.expires_ms > now_ms;
  SELECT t.token > p_token, t.slot INTO newer, kept_slot FROM tenure_runs AS t
    WHERE t.prefix = p_prefix AND t.name = p_name AND t.keep_until_ms > now_ms FOR UPDATE;
  IF held IS NOT TRUE OR newer IS TRUE OR p_slot <= kept_slot THEN
    RETURN false;
  END IF;
  INSERT INTO tenure_runs AS t (prefix, name, token, at_ms, keep_until_ms, slot)
    VALUES (p_prefix, p_name, p_token, now_ms, now_ms + p_keep, coalesce(p_slot, kept_slot))
    ON CONFLICT (prefix, name) DO UPDATE SET token = excluded.token, at_ms = excluded.at_ms,
      keep_until_ms = excluded.keep_until_ms, slot = excluded.slot
      -- A row another call inserted meanwhile (none was found above).
      WHERE p_slot IS NULL OR t.slot IS NULL OR t.slot < p_slot
        OR t.keep_until_ms <= now_ms;
  RETURN FOUND;
END
$$;

-- The elections under a prefix with a live lease, sorted.
CREATE OR REPLACE FUNCTION tenure_elections_of(p_prefix text)
RETURNS SETOF text
LANGUAGE sql VOLATILE AS $$
  SELECT t.name FROM tenure_leases AS t, (SELECT tenure_now() AS now_ms) AS n
    WHERE t.prefix = p_prefix AND t.expires_ms > n.now_ms ORDER BY t.name
$$;

INSERT INTO tenure_meta (key, value) VALUES ('schema', '1') ON CONFLICT (key) DO NOTHING;
