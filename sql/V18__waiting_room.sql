-- The waiting room of an event (docs/waiting-room.md): what the operator set, and the
-- lottery's seed. The seed is drawn once, when a room is first configured, and never
-- changes: its SHA-256 is published before the open (the commitment), the seed itself
-- after the draw. admit_per_s NULL means "auto" (the rate follows the core's backlog).
CREATE TABLE IF NOT EXISTS waiting_room (
  event_id             BIGINT UNSIGNED   NOT NULL PRIMARY KEY,
  enabled              TINYINT(1)        NOT NULL,
  opens_before_s       INT UNSIGNED      NOT NULL,
  admit_per_s          INT UNSIGNED      NULL,
  pass_ttl_s           INT UNSIGNED      NOT NULL,
  challenge_bits       TINYINT UNSIGNED  NOT NULL,
  require_pass_at_open TINYINT(1)        NOT NULL,
  seed                 CHAR(64)          NOT NULL,
  updated_at           DATETIME(3)       NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=ascii;
