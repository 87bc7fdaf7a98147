-- A REFUSED row keeps why MySQL's guards turned its reservation away (SOLD_OUT,
-- OVER_LIMIT, SEAT_TAKEN): an operator reads it there, and a later attempt that finds
-- the row (its first refusal never reached Redis) tells the buyer the same reason and
-- gives back their share as the first would have. NULL on every other row, and on
-- REFUSED rows from before it (their reason is not known). Can be run again.
ALTER TABLE stock_log ADD COLUMN IF NOT EXISTS reason VARCHAR(16) NULL;
