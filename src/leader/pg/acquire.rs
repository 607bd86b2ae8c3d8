//! The elector's acquisitions, batched: the `acquire` calls of one holder and ttl that arrive while a batch is in
//! flight go out together in the next `pgfence.acquire_many` statement — a group commit, with no timer: a lone
//! acquisition is sent at once, and a replica that a rebalance gave a hundred names sends a few statements, not a
//! hundred (each lease is still acquired exactly as `pgfence.acquire` would; the batch saves round trips,
//! per-statement checks and commits). The statement also answers each new tenure's first reads (its effects in
//! doubt, its handover gap), which the runtime would otherwise read in two more statements.
//!
//! A batch waits for no lock (its locks are held until all of it commits): a lease whose row or guard lock
//! another transaction holds is answered busy, and its caller acquires it on its own with `pgfence.acquire` (with
//! its bounded waits), as it would without batching. So does every caller of a batch that fails as a whole (a
//! lost connection).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::super::held::FirstReads;
use crate::error::Result;
use crate::lease::{Begun, Lease, MAX_ACQUIRE_BATCH};
use crate::store::Store;

/// What a caller waiting in a batch gets.
enum Answer {
    /// The batch answered for this name.
    Done(Result<(Lease, FirstReads)>),
    /// The lease was busy, or the batch failed as a whole: acquire alone.
    Alone,
}

/// One caller waiting for its name's answer.
struct Pending {
    name: String,
    answer: oneshot::Sender<Answer>,
}

/// The callers of one holder and ttl, and whether a batch of theirs is in flight.
#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    sending: bool,
}

/// The batched acquisitions of one elector.
#[derive(Debug)]
pub(super) struct Acquisitions {
    store: Store,
    queues: Mutex<HashMap<(String, Duration), Queue>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("pending", &self.pending.len())
            .field("sending", &self.sending)
            .finish()
    }
}

impl Acquisitions {
    pub(super) fn new(store: Store) -> Arc<Acquisitions> {
        Arc::new(Acquisitions {
            store,
            queues: Mutex::default(),
        })
    }

    /// Acquires `name` for `holder`, in the next batch of this holder and ttl; with what the statement read for
    /// the tenure's start.
    ///
    /// Dropped while waiting: a tenure the batch began for it is released in the background (no successor waits
    /// a ttl for a tenure nobody holds), unless the batch was already answered.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<(Lease, FirstReads)> {
        let (answer, wait) = oneshot::channel();
        let key = (holder.to_owned(), ttl);
        let start = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            let queue = queues.entry(key.clone()).or_default();
            queue.pending.push(Pending {
                name: name.to_owned(),
                answer,
            });
            !std::mem::replace(&mut queue.sending, true)
        };
        if start {
            tokio::spawn(self.clone().send_batches(key));
        }
        match wait.await {
            Ok(Answer::Done(answer)) => answer,
            // The batch failed as a whole, or its task ended without answering (the runtime shutting down).
            Ok(Answer::Alone) | Err(_) => {
                let lease = self.store.acquire(name, holder, ttl).await?;
                Ok((lease, FirstReads::default()))
            }
        }
    }

    /// Sends the batches of `key` until no caller waits: each takes what queued meanwhile.
    async fn send_batches(self: Arc<Self>, key: (String, Duration)) {
        loop {
            let batch: Vec<Pending> = {
                let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                let Some(queue) = queues.get_mut(&key) else {
                    return;
                };
                if queue.pending.is_empty() {
                    queues.remove(&key);
                    return;
                }
                let take = queue.pending.len().min(MAX_ACQUIRE_BATCH);
                queue.pending.drain(..take).collect()
            };
            let names: Vec<String> = batch.iter().map(|p| p.name.clone()).collect();
            match self.store.acquire_many(&names, &key.0, key.1).await {
                Ok(answers) => {
                    for (pending, answer) in batch.into_iter().zip(answers) {
                        self.answer(pending, answer);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, names = names.len(),
                        "a batched acquisition failed as a whole; each acquires alone");
                    for pending in batch {
                        let _ = pending.answer.send(Answer::Alone);
                    }
                }
            }
        }
    }

    /// Hands `answer` to its caller (`None`: the lease was busy, acquire alone); a tenure begun for a caller that
    /// stopped waiting is released.
    fn answer(&self, pending: Pending, answer: Option<Result<Begun>>) {
        let Some(answer) = answer else {
            let _ = pending.answer.send(Answer::Alone);
            return;
        };
        let answer = answer.map(|begun| {
            let first = FirstReads {
                in_doubt: begun.in_doubt,
                gap: Some(begun.gap),
            };
            (begun.lease, first)
        });
        if let Err(Answer::Done(Ok((lease, _)))) = pending.answer.send(Answer::Done(answer)) {
            let store = self.store.clone();
            tokio::spawn(async move {
                if let Err(e) = store.release(&lease).await {
                    tracing::debug!(lease = %lease.qualified_name(), error = %e,
                        "releasing a tenure begun for a cancelled acquisition failed; it expires");
                }
            });
        }
    }
}
