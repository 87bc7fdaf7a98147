-- consumed_message was never used: stock sync is idempotent through stock_log.synced,
-- and the timeout consumer through the order's status.
DROP TABLE IF EXISTS consumed_message;
