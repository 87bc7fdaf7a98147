-- An event on sale: a concert, a train, a voucher drop. Times are UTC.
-- status: DRAFT (created) → PUBLISHED (preloaded, on sale in its window) ⇄ CLOSED.
CREATE TABLE IF NOT EXISTS event (
  id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  title          VARCHAR(200)    NOT NULL,
  venue          VARCHAR(200)    NOT NULL,
  show_time      DATETIME(3)     NOT NULL,
  sale_start     DATETIME(3)     NOT NULL,
  sale_end       DATETIME(3)     NOT NULL,
  per_user_limit INT UNSIGNED    NOT NULL,
  pay_timeout_s  INT UNSIGNED    NOT NULL,
  status         VARCHAR(16)     NOT NULL DEFAULT 'DRAFT',
  created_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_event_status_sale (status, sale_start)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
