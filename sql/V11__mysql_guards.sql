-- The last line of defence (DESIGN.md invariants 1, 3, 4): order creation's transaction
-- refuses what would break an invariant, whatever Redis says.
--
-- committed: units in live (UNPAID, PAID) orders of the category. Order creation raises
-- it once per batch and category, only while committed + n <= total; a cancellation
-- lowers it. remain (stock sync's view) may never go below 0 either.
ALTER TABLE ticket_category ADD COLUMN IF NOT EXISTS committed INT UNSIGNED NOT NULL DEFAULT 0;
ALTER TABLE ticket_category ADD CONSTRAINT IF NOT EXISTS ck_category_committed CHECK (committed <= total);
ALTER TABLE ticket_category ADD CONSTRAINT IF NOT EXISTS ck_category_remain CHECK (remain >= 0);
-- Units a buyer holds in live orders of an event, raised by order creation only up to
-- the event's per_user_limit, lowered by a cancellation.
CREATE TABLE IF NOT EXISTS user_hold (
  event_id BIGINT UNSIGNED NOT NULL,
  user_id  BIGINT UNSIGNED NOT NULL,
  units    INT UNSIGNED    NOT NULL,
  PRIMARY KEY (event_id, user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
-- seq: the admission's number in its event's Redis state (meta.seq, only ever grows).
-- Unique per event, so a Redis gone back in time that hands a number out again is
-- caught; the event's largest is where a rebuild of its keys starts counting.
ALTER TABLE stock_log ADD COLUMN IF NOT EXISTS seq BIGINT UNSIGNED NULL;
ALTER TABLE stock_log ADD UNIQUE KEY IF NOT EXISTS uk_stock_log_seq (event_id, seq);
