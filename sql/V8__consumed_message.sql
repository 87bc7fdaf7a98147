-- Dedupe for message consumers: a (consumer, key) seen once is skipped when redelivered.
CREATE TABLE IF NOT EXISTS consumed_message (
  consumer    VARCHAR(64)  NOT NULL,
  msg_key     VARCHAR(128) NOT NULL,
  consumed_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (consumer, msg_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
