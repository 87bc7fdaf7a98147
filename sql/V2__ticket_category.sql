-- A kind of ticket within an event. `remain` is MySQL's view of what is unsold; it lags
-- Redis during a sale and may go below 0 only through a bug (an alarm, never clamped).
-- Seated categories have seat_rows × seat_cols seats; `total` is their count.
CREATE TABLE IF NOT EXISTS ticket_category (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  event_id    BIGINT UNSIGNED NOT NULL,
  name        VARCHAR(100)    NOT NULL,
  price_cents BIGINT UNSIGNED NOT NULL,
  total       INT UNSIGNED    NOT NULL,
  remain      INT             NOT NULL,
  seat_rows   INT UNSIGNED    NULL,
  seat_cols   INT UNSIGNED    NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_category_event_name (event_id, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
