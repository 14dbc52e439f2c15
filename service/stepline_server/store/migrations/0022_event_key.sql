-- A run an event started keeps the id the event's sender gave (shown as its eventId).

ALTER TABLE runs ADD COLUMN event_key text;
COMMENT ON COLUMN runs.event_key IS 'The id the sender gave the event that started the run (events.key), or NULL: its eventId is then event_id.';
