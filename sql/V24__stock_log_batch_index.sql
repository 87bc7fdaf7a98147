-- The order-timeout message names its batch's orders (2026-11-24): nothing looks
-- stock_log up by batch any more (the check-back and stock sync read stock_batch), and
-- the index cost every order one more B-tree entry. Can be run again.
ALTER TABLE stock_log DROP INDEX IF EXISTS idx_stock_log_batch;
