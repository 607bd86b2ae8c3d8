//! The release listener: one connection LISTENing for released leases and for the news of the replica groups
//! this process joined (each group has a channel of its own), fanned out to the elector's waiters, and the cache
//! of lease names its notifications are resolved with.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;
use tokio::sync::{broadcast, Notify};

use crate::error::Result;
use crate::leader::held::{GroupWake, Wake};
use crate::store::Store;

/// The group channels the listener LISTENs to: added by joins, LISTENed at once and again after every
/// reconnection.
#[derive(Debug, Default)]
pub(super) struct Channels {
    wanted: Mutex<BTreeSet<String>>,
    added: Notify,
}

impl Channels {
    /// Asks the listener to LISTEN to `channel` too (a channel is never unlistened: a process joins few groups).
    pub(super) fn add(&self, channel: &str) {
        let new = self
            .wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(channel.to_owned());
        if new {
            self.added.notify_one();
        }
    }

    fn wanted(&self) -> BTreeSet<String> {
        self.wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// `LISTEN` for each of `channels` not in `listening` yet (quoted: a channel is an identifier).
async fn listen_to(
    conn: &mut AsyncPgConnection,
    channels: &Channels,
    listening: &mut BTreeSet<String>,
) -> diesel::QueryResult<()> {
    use diesel_async::SimpleAsyncConnection;
    for channel in channels.wanted() {
        if listening.contains(&channel) {
            continue;
        }
        conn.batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
            .await?;
        listening.insert(channel);
    }
    Ok(())
}

/// What a group channel's payload says; `None` for one it never sends.
fn group_wake(payload: &str) -> Option<GroupWake> {
    match payload.split_once(' ') {
        Some(("changed", due_in_ms)) => due_in_ms
            .parse()
            .ok()
            .map(|ms| GroupWake::Changed(Duration::from_millis(ms))),
        Some(("assigned", generation)) => generation.parse().ok().map(GroupWake::Assigned),
        _ => None,
    }
}

/// First delay before the release listener reconnects; it doubles up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest delay between the release listener's connection attempts. Short: while it is away, releases go unheard
/// (waiters sleep out their timers, up to `poll_every`), and an attempt against a server that is down costs it
/// nothing. A cap of 5 s would space the attempts 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s after the connection was
/// lost: a server back after 3.2 s would be listened to again only 3.1 s later.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(1);

/// Keeps one dedicated connection LISTENing for released leases and for the channels of the groups this process
/// joined, and fans what it hears out. Reconnects after 100 ms, doubling up to 1 s; while it is down, waiters
/// fall back to their timeouts, and each time it LISTENs — the first time too: a waiter may have subscribed
/// before the listener was listening — every waiter is woken ([`Wake::Resumed`]) to look for what it did not
/// hear.
///
/// A release notification carries the released lease's lock key, not its name (any role may LISTEN): the name
/// is known from the cache ([`LeaseKeys`]), which holds the keys of the names this process was assigned or waited
/// for. A key it does not know is looked up in `pgfence.leases` (which shows only leases of clusters this role
/// has a grant on) only while a waiter's key is still being read; otherwise it is the release of a name nobody
/// here waits for, and is skipped — in a fleet every replica hears every release, and looking each one up would
/// cost (releases × replicas) statements and hold the listener's queue behind them.
pub(super) async fn listen(
    store: Store,
    names: Arc<LeaseKeys>,
    tx: broadcast::Sender<Wake>,
    channels: Arc<Channels>,
) {
    use diesel_async::SimpleAsyncConnection;
    use futures_util::StreamExt;
    let mut delay = LISTEN_RETRY_MIN;
    loop {
        match store.listening_connection().await {
            Ok(mut conn) => {
                let mut listening = BTreeSet::new();
                // The release channel last: what `pg_stat_activity` shows of the listener.
                let listened = async {
                    listen_to(&mut conn, &channels, &mut listening).await?;
                    conn.batch_execute("LISTEN pgfence_lease_free").await
                }
                .await;
                if let Err(e) = listened {
                    tracing::debug!(error = %e, "LISTEN failed");
                } else {
                    delay = LISTEN_RETRY_MIN;
                    let _ = tx.send(Wake::Resumed);
                    loop {
                        // The stream only reads the connection's notification queue: dropping it between
                        // notifications loses none, and frees the connection for the name lookup and LISTENs.
                        let next = {
                            let stream = conn.notifications_stream();
                            let mut stream = std::pin::pin!(stream);
                            tokio::select! {
                                next = stream.next() => Some(next),
                                _ = channels.added.notified() => None,
                            }
                        };
                        match next {
                            None => {
                                // The release channel again, last: `pg_stat_activity` keeps showing it as the
                                // listener's query (LISTEN is idempotent).
                                let listened = async {
                                    listen_to(&mut conn, &channels, &mut listening).await?;
                                    conn.batch_execute("LISTEN pgfence_lease_free").await
                                }
                                .await;
                                if let Err(e) = listened {
                                    tracing::debug!(error = %e, "LISTEN to a group's channel failed");
                                    break;
                                }
                            }
                            Some(Some(Ok(n))) if n.channel == "pgfence_lease_free" => {
                                let Ok(key) = n.payload.parse::<i32>() else {
                                    continue;
                                };
                                if let Some(name) = lease_name(&mut conn, &names, key).await {
                                    let _ = tx.send(Wake::Free(name));
                                }
                            }
                            Some(Some(Ok(n))) => {
                                if let Some(news) = group_wake(&n.payload) {
                                    let _ = tx.send(Wake::Group {
                                        channel: n.channel,
                                        news,
                                    });
                                }
                            }
                            Some(Some(Err(e))) => {
                                tracing::debug!(error = %e, "release listener connection failed");
                                break;
                            }
                            Some(None) => break,
                        }
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "release listener cannot connect")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(LISTEN_RETRY_MAX);
    }
}

/// The lock keys this process knows the names of (lock keys are never reused and names never change), and how
/// many of its waiters may wait for a name whose key it does not know yet.
///
/// A release notification carries only the lock key. An unknown key is looked up only while such a waiter
/// exists ([`Reading`]): counted from before the waiter's acquisition attempt (or the read of a member's names)
/// until its key is cached, so that a release committed after the attempt's snapshot is always resolved — and
/// the release of a name nobody here waits for costs no statement.
#[derive(Debug, Default)]
pub(super) struct LeaseKeys {
    cache: Mutex<KeyCache>,
    reading: AtomicUsize,
}

#[derive(Debug, Default)]
struct KeyCache {
    by_key: HashMap<i32, String>,
    known: HashSet<String>,
}

/// One waiter whose lease's key may be unknown, counted in [`LeaseKeys`] until dropped.
#[derive(Debug)]
pub(super) struct Reading(Arc<LeaseKeys>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.reading.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LeaseKeys {
    /// Whether the key of `qualified` is known (O(1)).
    pub(super) fn knows(&self, qualified: &str) -> bool {
        self.lock().known.contains(qualified)
    }

    /// Counts a waiter that may wait for a name whose key is not known yet, until the guard is dropped.
    pub(super) fn reading(self: &Arc<Self>) -> Reading {
        self.reading.fetch_add(1, Ordering::SeqCst);
        Reading(self.clone())
    }

    /// Whether an unknown key must be looked up: some waiter's key may be it.
    fn anyone_reading(&self) -> bool {
        self.reading.load(Ordering::SeqCst) > 0
    }

    fn name_of(&self, key: i32) -> Option<String> {
        self.lock().by_key.get(&key).cloned()
    }

    fn learn(&self, key: i32, name: String) {
        let mut cache = self.lock();
        cache.known.insert(name.clone());
        cache.by_key.insert(key, name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeyCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The name of the lease with lock key `key`, if this role can see it and someone here may wait for it (cached).
/// Looked up on the listener's own connection, the one that just proved alive: right after an outage the pool
/// may still hand out connections that died with the server, or none at all during its reconnect backoff, and
/// the notification would be lost.
async fn lease_name(conn: &mut AsyncPgConnection, keys: &LeaseKeys, key: i32) -> Option<String> {
    use diesel::OptionalExtension;
    use diesel_async::RunQueryDsl;
    if let Some(name) = keys.name_of(key) {
        return Some(name);
    }
    if !keys.anyone_reading() {
        return None;
    }
    let name: Option<String> = diesel::select(
        diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>(
            "(SELECT name FROM pgfence.leases WHERE lock_key = ",
        )
        .bind::<diesel::sql_types::Integer, _>(key)
        .sql(")"),
    )
    .get_result::<Option<String>>(conn)
    .await
    .optional()
    .ok()
    .flatten()
    .flatten();
    if let Some(name) = &name {
        keys.learn(key, name.clone());
    }
    name
}

/// The lock key and name of every lease of `qualified` that the listener does not know yet, read in one
/// statement into its cache. Called after a member read its names, off the path of any release: so that the
/// release of a name that changes hands wakes its successor at once, not after a lookup of the key on the
/// listener's connection (one statement more on the path of every handover of a name this process never saw
/// released).
/// `reading` is the count of the waiters it reads for: dropped once their keys are cached (or the read failed,
/// when their releases fall back to the poll).
pub(super) async fn warm_lease_names(
    store: &Store,
    keys: &LeaseKeys,
    qualified: Vec<String>,
    reading: Reading,
) {
    let missing: Vec<String> = {
        let cache = keys.lock();
        qualified
            .into_iter()
            .filter(|n| !cache.known.contains(n))
            .collect()
    };
    if missing.is_empty() {
        return;
    }
    #[derive(QueryableByName)]
    struct KeyRow {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        lock_key: i32,
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    let rows: Result<Vec<KeyRow>> = store
        .load_all(
            diesel::sql_query("SELECT lock_key, name FROM pgfence.leases WHERE name = ANY($1)")
                .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(missing),
        )
        .await;
    if let Ok(rows) = rows {
        for row in rows {
            keys.learn(row.lock_key, row.name);
        }
    }
    drop(reading);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group channel's payloads decode to what they say, and anything else is ignored, never guessed.
    #[test]
    fn group_payloads_decode_exactly() {
        assert_eq!(
            group_wake("changed 1000"),
            Some(GroupWake::Changed(Duration::from_secs(1)))
        );
        assert_eq!(
            group_wake("changed 0"),
            Some(GroupWake::Changed(Duration::ZERO))
        );
        assert_eq!(group_wake("assigned 17"), Some(GroupWake::Assigned(17)));
        for other in [
            "",
            "changed",
            "changed -1",
            "changed x",
            "assigned",
            "assigned x",
            "moved 3",
        ] {
            assert_eq!(group_wake(other), None, "{other:?}");
        }
    }
}
