-- The environment's expert action from each transition's state (what the game's walkthrough does
-- there), where the environment has an expert: the label behaviour cloning imitates. NULL for
-- synthetic transitions and for environments without an expert.
ALTER TABLE transitions ADD COLUMN expert_action text;
