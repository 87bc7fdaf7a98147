//! The workers' Redis calls: read and reclaim stream entries, settle committed
//! reservations, release ones that will never become orders.

use std::sync::LazyLock;
use std::time::Duration;

use crate::infra::redis::Redis;
use redis::streams::{StreamClaimReply, StreamReadOptions, StreamReadReply};

use super::reservation::Reservation;

use crate::keys::{Bucket, Keys};
use crate::script_codes::ScriptCode;

/// The consumer group every core instance's workers share.
pub const GROUP: &str = "order-workers";

static SETTLE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/settle.lua")));
static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(crate::with_lua_lib!("release.lua")));
static REFUSE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/refuse.lua")));

static KEEP_CLAIMED: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/keep_claimed.lua"))
});

static CLAIM_STALE: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/claim_stale.lua"))
});

static DROP_STALE: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/drop_stale.lua"))
});

/// `drop_stale.lua`'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    Dropped = 1,
    NotYet = 0,
}

impl crate::script_codes::ScriptCode for Dropped {
    const SCRIPT: &'static str = "drop_stale.lua";
    const ALL: &'static [Dropped] = &[Dropped::Dropped, Dropped::NotYet];

    fn code(self) -> i64 {
        self as i64
    }
}

/// Drops reservations an event's rebuild made stale, once the rebuild is in Redis,
/// telling `reason` to each buyer whose status is of no purchase or of an earlier order
/// (one the rebuild wrote: not the reservation's own order, nor a later purchase), and
/// recording it as the purchase's own (`keys::replaced_purchase`) for the others but
/// the reservation's own order;
/// [`SETTLE_CHUNK`] per run of the script. NOT_YET comes from the first run (the epoch
/// only grows). A run failing part way leaves some dropped: dropping them again changes
/// nothing, so the caller retries them all.
pub async fn drop_stale(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    stale: &[Reservation],
    reason: &str,
) -> anyhow::Result<Dropped> {
    let newest = stale.iter().map(|r| r.epoch).max().unwrap_or(0);
    let (stream, status, meta) = (
        keys.order_stream(bucket),
        keys.purchase_status(bucket),
        keys.meta(bucket),
    );
    for chunk in stale.chunks(SETTLE_CHUNK) {
        let mut call = DROP_STALE.key(&stream);
        call.key(&status)
            .key(&meta)
            .arg(GROUP)
            .arg(reason)
            .arg(newest);
        for r in chunk {
            call.arg(&r.entry_id).arg(r.user_id).arg(r.order_no.0);
        }
        if Dropped::from_code(call.invoke_async(redis).await?)? == Dropped::NotYet {
            return Ok(Dropped::NotYet);
        }
    }
    Ok(Dropped::Dropped)
}

/// `refuse.lua`'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Refused = 1,
    AlreadyDone = 0,
}

impl crate::script_codes::ScriptCode for Refused {
    const SCRIPT: &'static str = "refuse.lua";
    const ALL: &'static [Refused] = &[Refused::Refused, Refused::AlreadyDone];

    fn code(self) -> i64 {
        self as i64
    }
}

/// What [`settle`] did: the first `settled` reservations are settled (every run of
/// `settle.lua` for them answered), `acked` entries were acknowledged, and `failed` says
/// why the rest were not (they stay pending; a replay settles them).
#[derive(Debug)]
pub struct Settled {
    pub settled: usize,
    pub acked: u64,
    pub failed: Option<anyhow::Error>,
}

/// `release.lua`'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    Released = 1,
    AlreadyDone = 0,
}

impl crate::script_codes::ScriptCode for Released {
    const SCRIPT: &'static str = "release.lua";
    const ALL: &'static [Released] = &[Released::Released, Released::AlreadyDone];

    fn code(self) -> i64 {
        self as i64
    }
}

/// Creates the event's consumer group (and stream) if missing.
pub async fn ensure_group(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
) -> redis::RedisResult<()> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(keys.order_stream(bucket))
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(redis)
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// Which of a consumer's entries to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entries {
    /// Never delivered to any consumer yet.
    New,
    /// Delivered to this consumer before and not acknowledged: what it was doing when
    /// Redis went away (an AOF replay brings them back as pending), or, under the same
    /// worker id, before the core restarted. Read at once instead of waiting `claim_idle`.
    OwnPending,
}

/// The most entries one call reads or claims (XREADGROUP, `claim_stale.lua`,
/// `keep_claimed.lua`), and the most reservations one call writes for (`settle.lua`,
/// `drop_stale.lua`). Redis runs one call at a time, so every purchase that reaches it
/// during a call waits for the whole of it: during a 200 000-buyer sale (SLOWLOG) a
/// batch's settle of 1 000 took 8 ms (up to 11) and its read 2 ms (up to 4). In chunks of
/// these sizes a call takes about a millisecond (README "Measured"), and the purchases
/// run between them; the work per entry is the same. Taking over, keeping claimed and
/// dropping happen when a batch is slow, a worker stopped or the keys were rebuilt —
/// during a sale, when they should hold Redis no longer than a read or a settle.
const READ_CHUNK: usize = 256;
const SETTLE_CHUNK: usize = 128;

/// This consumer's entries of `which` kind, at most `count`, read [`READ_CHUNK`] at a
/// time. Any chunk failing fails the read, as one call failing would: what the chunks
/// before it delivered is this consumer's, pending, and read again as its own.
pub async fn read(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    consumer: &str,
    count: usize,
    which: Entries,
) -> redis::RedisResult<Vec<redis::streams::StreamId>> {
    // New entries: `>` each time. Own pending ones: after the last one read.
    let mut from = match which {
        Entries::New => ">".to_owned(),
        Entries::OwnPending => "0".to_owned(),
    };
    let stream = keys.order_stream(bucket);
    let mut entries = Vec::new();
    while entries.len() < count {
        let asked = (count - entries.len()).min(READ_CHUNK);
        let opts = StreamReadOptions::default()
            .group(GROUP, consumer)
            .count(asked);
        let reply: Option<StreamReadReply> =
            redis::AsyncCommands::xread_options(redis, &[&stream], &[&from], &opts).await?;
        let chunk: Vec<_> = reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default();
        let got = chunk.len();
        if let (Entries::OwnPending, Some(last)) = (which, chunk.last()) {
            from.clone_from(&last.id);
        }
        entries.extend(chunk);
        if got < asked {
            break;
        }
    }
    Ok(entries)
}

/// Entries held longer than `idle`: another consumer's (it stopped or hangs), or this
/// one's own left idle; at most `count`, [`READ_CHUNK`] a run of `claim_stale.lua`,
/// each run going on through the pending list from where the last one stopped (so no
/// entry is taken twice, however long between runs). A run failing after others took
/// entries ends the call with those (the rest are found on the next pass).
pub async fn claim_stale(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    consumer: &str,
    idle: Duration,
    count: usize,
) -> redis::RedisResult<Claimed> {
    let stream = keys.order_stream(bucket);
    let mut claimed = Claimed {
        entries: Vec::new(),
        others: 0,
    };
    let mut from = "-".to_owned();
    while claimed.entries.len() < count {
        let asked = (count - claimed.entries.len()).min(READ_CHUNK);
        let run: redis::RedisResult<(u64, StreamClaimReply, usize, String)> = CLAIM_STALE
            .key(&stream)
            .arg(GROUP)
            .arg(consumer)
            .arg(idle.as_millis() as u64)
            .arg(asked)
            .arg(&from)
            .invoke_async(redis)
            .await;
        let (others, reply, looked, last) = match run {
            Ok(run) => run,
            Err(e) if claimed.entries.is_empty() => return Err(e),
            Err(e) => {
                tracing::warn!(event_id = %bucket.event, error = %e, taken = claimed.entries.len(), "claiming idle entries failed part way; going on with those taken");
                break;
            }
        };
        claimed.others += others;
        claimed.entries.extend(reply.ids);
        // Fewer pending entries than asked: none idle left after them.
        if looked < asked {
            break;
        }
        from = format!("({last}");
    }
    Ok(claimed)
}

/// `claim_stale.lua`'s answer: the entries taken, and how many of them another
/// consumer held (a takeover; the rest were this consumer's own, idle).
#[derive(Debug)]
pub struct Claimed {
    pub entries: Vec<redis::streams::StreamId>,
    pub others: u64,
}

/// `keep_claimed.lua`'s answer: how many of the batch's entries it kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept(pub u64);

/// A batch's entry ids in stream order, in runs of at most [`READ_CHUNK`]: what
/// [`keep_claimed`] takes per call (each run one stretch of the stream, which the script
/// reads this consumer's pending entries over).
pub fn keep_claimed_runs<'a>(ids: &[&'a str]) -> Vec<Vec<&'a str>> {
    let mut ids = ids.to_vec();
    ids.sort_by_key(|id| {
        id.split_once('-')
            .and_then(|(ms, seq)| Some((ms.parse::<u64>().ok()?, seq.parse::<u64>().ok()?)))
    });
    ids.chunks(READ_CHUNK).map(<[&str]>::to_vec).collect()
}

/// Resets the idle time of the entries `run` (one of [`keep_claimed_runs`]) that
/// `consumer` still holds (XCLAIM … JUSTID, by `keep_claimed.lua`), so that a batch still
/// being worked on (a slow MySQL, retries, orders created one by one) is not taken over
/// as a stopped worker's by `claim_stale`. Entries acknowledged meanwhile or taken over
/// by another consumer are left alone.
pub async fn keep_claimed(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    consumer: &str,
    run: &[&str],
) -> redis::RedisResult<Kept> {
    let mut call = KEEP_CLAIMED.key(keys.order_stream(bucket));
    call.arg(GROUP).arg(consumer).arg(run);
    Ok(Kept(call.invoke_async(redis).await?))
}

/// Marks the reservations CREATED and drops their entries, [`SETTLE_CHUNK`] per run of
/// the script. A failed run stops there: the reservations before its chunk are settled,
/// its chunk and the ones after stay pending.
pub async fn settle(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    reservations: &[Reservation],
) -> Settled {
    let (stream, status) = (keys.order_stream(bucket), keys.purchase_status(bucket));
    let mut done = Settled {
        settled: 0,
        acked: 0,
        failed: None,
    };
    for chunk in reservations.chunks(SETTLE_CHUNK) {
        let mut call = SETTLE.key(&stream);
        call.key(&status).arg(GROUP);
        for r in chunk {
            call.arg(&r.entry_id).arg(r.user_id).arg(r.order_no);
        }
        match call.invoke_async::<u64>(redis).await {
            Ok(acked) => {
                done.settled += chunk.len();
                done.acked += acked;
            }
            Err(e) => {
                done.failed = Some(e.into());
                break;
            }
        }
    }
    done
}

/// Drops entries without settling or releasing anything (malformed entries, and
/// reservations a rebuild of the event's keys already counted as free).
pub async fn drop_entries(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    entry_ids: &[&str],
) -> anyhow::Result<()> {
    if entry_ids.is_empty() {
        return Ok(());
    }
    let stream = keys.order_stream(bucket);
    ::redis::pipe()
        .xack(&stream, GROUP, entry_ids)
        .ignore()
        .xdel(&stream, entry_ids)
        .ignore()
        .query_async::<()>(redis)
        .await?;
    Ok(())
}

/// Gives one reservation back and marks it FAILED with `reason`.
pub async fn release(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    r: &Reservation,
    reason: &str,
) -> anyhow::Result<Released> {
    // Seats in another slot (an event of several buckets) go back first, with their
    // units; seat_free.lua frees only seats still locked for this request, so a repeat
    // (the entry claimed again after a crash here) changes nothing.
    let seats_elsewhere = !bucket.holds_seats() && !r.seats_raw.is_empty();
    if seats_elsewhere {
        crate::admission::seat_lock::free(
            redis,
            keys,
            bucket.event,
            r.category_id,
            r.order_no,
            &r.seats_raw,
        )
        .await?;
    }
    let (seats_key, row_free_key) = if r.journey.is_some() {
        (
            keys.segments(bucket, r.category_id),
            keys.segment_versions(bucket.event),
        )
    } else if bucket.holds_seats() {
        (
            keys.seats(bucket, r.category_id),
            keys.row_free(bucket, r.category_id),
        )
    } else {
        (keys.stock(bucket), keys.stock(bucket))
    };
    let back = if seats_elsewhere { 0 } else { r.units() };
    let code: i64 = RELEASE
        .key(keys.order_stream(bucket))
        .key(keys.purchase_status(bucket))
        .key(keys.stock(bucket))
        .key(keys.dry(bucket))
        .key(keys.held(bucket))
        .key(seats_key)
        .key(row_free_key)
        .key(keys.meta(bucket))
        .arg(GROUP)
        .arg(&r.entry_id)
        .arg(r.order_no)
        .arg(r.user_id)
        .arg(r.category_id)
        .arg(r.quantity)
        .arg(if seats_elsewhere {
            ""
        } else {
            r.seats_raw.as_str()
        })
        .arg(reason)
        .arg(back)
        .arg(r.journey.map(|j| j.encode()).unwrap_or_default())
        .arg(r.epoch)
        .invoke_async(redis)
        .await?;
    Released::from_code(code)
}

/// What MySQL had left of a category when it refused a reservation sold out, and what
/// Redis had given back before MySQL read it: the bucket's restocked set's size, read
/// before the batch's transaction ([`restocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    pub units: i64,
    pub restocks: u64,
}

/// How many times units came into the bucket from elsewhere so far: cancelled orders
/// given back into it (its restocked set) and moves credited to it (its credited set,
/// an event of several buckets: a unit given back into another bucket may reach this
/// one so). Both sets only grow. Read before a batch's transaction reads what MySQL has
/// left, so that a refusal's [`Cap`] applies only if no unit came in since.
pub async fn restocks(redis: &mut Redis, keys: &Keys, bucket: Bucket) -> anyhow::Result<u64> {
    let (restocked, credited): (u64, u64) = redis::pipe()
        .scard(keys.restocked(bucket))
        .scard(keys.credited(bucket))
        .query_async(redis)
        .await?;
    Ok(restocked + credited)
}

/// Marks a reservation MySQL turned away FAILED with `reason`, giving no stock back;
/// lowers the category's stock to `cap` when given and no cancelled order was given
/// back into the bucket since it was read. The buyer's share in Redis is given back
/// unless `keep_share` (refuse.lua says why).
pub async fn refuse(
    redis: &mut Redis,
    keys: &Keys,
    bucket: Bucket,
    r: &Reservation,
    reason: &str,
    cap: Option<Cap>,
    keep_share: bool,
) -> anyhow::Result<Refused> {
    let code: i64 = REFUSE
        .key(keys.order_stream(bucket))
        .key(keys.purchase_status(bucket))
        .key(keys.stock(bucket))
        .key(keys.dry(bucket))
        .key(keys.held(bucket))
        .key(keys.meta(bucket))
        .key(keys.restocked(bucket))
        .key(keys.credited(bucket))
        .arg(GROUP)
        .arg(&r.entry_id)
        .arg(r.order_no)
        .arg(r.user_id)
        .arg(r.category_id)
        .arg(reason)
        .arg(cap.map_or(-1, |c| c.units.max(0)))
        .arg(if keep_share { 0 } else { r.quantity })
        .arg(r.epoch)
        .arg(cap.map_or(0, |c| c.restocks))
        .invoke_async(redis)
        .await?;
    Refused::from_code(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_the_script_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<Released>(include_str!(
            "../../../lua/redis/release.lua"
        ));
        crate::script_codes::assert_mirrored::<Refused>(include_str!(
            "../../../lua/redis/refuse.lua"
        ));
        crate::script_codes::assert_mirrored::<Dropped>(include_str!(
            "../../../lua/redis/drop_stale.lua"
        ));
    }
}
