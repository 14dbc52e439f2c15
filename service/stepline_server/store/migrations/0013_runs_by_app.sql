-- Deleting an app finds its runs (to lock them in id order, and in the cascade) through an
-- index, not by reading every run of every app.

CREATE INDEX runs_app ON runs (app_id);
