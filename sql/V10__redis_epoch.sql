-- The generation of an event's keys in Redis. Every rebuild of the keys from MySQL
-- (after Redis lost them) increments it under the row's exclusive lock; admission
-- stamps each reservation with the generation it was taken in, and order creation
-- (which holds the row's shared lock) refuses reservations of an older generation: the
-- rebuild has already counted their units as free.
ALTER TABLE event ADD COLUMN IF NOT EXISTS redis_epoch INT UNSIGNED NOT NULL DEFAULT 0;
