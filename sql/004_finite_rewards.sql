-- The buffer refuses a reward that is not a finite number, whoever writes it: NaN or infinity turns
-- every mean over the buffer into NaN. (Postgres orders NaN above every number and equal to itself,
-- so each value is named.) NOT VALID: rows stored before this migration are not re-checked (a
-- buffer that took such rows stays usable); every new row is.
ALTER TABLE transitions ADD CONSTRAINT transitions_reward_finite
    CHECK (reward <> 'NaN'::float8 AND reward <> 'Infinity'::float8 AND reward <> '-Infinity'::float8) NOT VALID;
