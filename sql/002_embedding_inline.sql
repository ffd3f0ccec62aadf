-- Keep each embedding inline in its row. With the default (EXTENDED) storage a 384-dim vector
-- (1.5 kB) is the largest value of a ~3 kB transition row, so TOAST moves it out of line and every
-- distance an exact scan computes costs three extra page reads (measured: 8 ms instead of <1 ms for
-- a 3000-row scan; the planner picks exact scans on small buffers). MAIN moves the state texts out
-- first and the embedding only if the row still does not fit a page, so large encoders still work.
-- Applies to rows written from now on.
ALTER TABLE transitions ALTER COLUMN embedding SET STORAGE MAIN;
