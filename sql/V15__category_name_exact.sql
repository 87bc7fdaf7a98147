-- Category names are unique within an event exactly as the admin API compares them
-- (byte for byte, after trimming). The table's default collation compared them
-- case-insensitively and took every character outside the Basic Multilingual Plane for
-- the same, so "GA" beside "ga", or two different emoji, passed validation and then hit
-- the unique key: a 500 instead of two categories.
ALTER TABLE ticket_category
  MODIFY name VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
