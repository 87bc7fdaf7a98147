-- stock_log is found by its order number everywhere (the guards' reads, stock sync's
-- update, a cancellation, the check-back through the batch index): that number is now
-- the clustered key, and the surrogate id and the unique index that repeated it are
-- gone — one B-tree insert fewer per order, and no second lookup through a secondary
-- index. One ALTER, so it is all or nothing, and it can be run again.
ALTER TABLE stock_log
  DROP PRIMARY KEY,
  DROP COLUMN IF EXISTS id,
  ADD PRIMARY KEY (order_no),
  DROP INDEX IF EXISTS uk_stock_log_order;
