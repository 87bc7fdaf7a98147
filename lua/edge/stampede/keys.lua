-- Generated from core/src/keys.rs (keys::edge_layout); do not edit. After a change
-- there, `STAMPEDE_WRITE_EDGE_LAYOUT=1 cargo test -p stampede-core keys` rewrites it.
return {
  sales = "sales",
  edge_limits = "edge:limits",
  sold_out = "{ev:%s}:soldout",
  meta = "{ev:%s}:meta",
  segment_versions = "{ev:%s}:segver",
  room = "{ev:%s}:room",
  room_early = "{ev:%s}:room:early",
  room_positions = "{ev:%s}:room:pos",
  room_steps = "{ev:%s}:room:steps",
  idempotency = "{%s}:idem",
  passed = "{ev:%s}:passed",
  revoked_tokens = "auth:revoked",
}
