//! What a supervisor reports while it runs: which controllers this process leads, where it stands in its group,
//! and the store's health ([`SupervisorStatus`], [`Readiness`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::leader::held::Health;
use crate::leader::Elector;

#[derive(Debug, Default)]
pub(super) struct Status {
    pub(super) leading: BTreeMap<String, bool>,
    pub(super) group: Option<GroupStatus>,
    /// Tenures handed over, counted by the names' loops.
    pub(super) handovers: Arc<AtomicU64>,
    /// The members the group's last assignment counted, as this replica last read it.
    pub(super) counted: usize,
    /// Whether this replica is a live member now (`None`: not spreading, or not joined yet), for those who wait
    /// for a change instead of polling ([`SupervisorStatus::membership`]).
    pub(super) member: tokio::sync::watch::Sender<Option<bool>>,
}

/// Where a spreading supervisor stands in its group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group's name (without cluster).
    pub group: String,
    /// This replica's member name (its holder).
    pub member: String,
    /// Whether it is a live member now.
    pub is_member: bool,
    /// Whether it is settled (the group's assignment counts it).
    pub settled: bool,
    /// The generation of the group's stored assignment this replica last read.
    pub generation: i64,
    /// The names the group's assignment gives this replica.
    pub assigned: BTreeSet<String>,
    /// The names this replica leads now.
    pub leading: BTreeSet<String>,
    /// Tenures this replica ended to hand their name over.
    pub handovers: u64,
}

/// Readiness in separate dimensions: the store, per controller whether this process leads it, and for a
/// spreading supervisor, where it stands in its group (which names it leads and which it should lead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Readiness {
    /// The backing store's health.
    pub store: Health,
    /// Controller name → leading now.
    pub leading: BTreeMap<String, bool>,
    /// The group, when the supervisor spreads.
    pub group: Option<GroupStatus>,
}

/// A handle to a running supervisor's status.
#[derive(Debug, Clone)]
pub struct SupervisorStatus<E: Elector> {
    pub(super) elector: E,
    pub(super) status: Arc<Mutex<Status>>,
}

impl<E: Elector> SupervisorStatus<E> {
    /// Which controllers this process leads now.
    pub fn leading(&self) -> BTreeMap<String, bool> {
        lock(&self.status).leading.clone()
    }

    /// Where this replica stands in its group (`None` for a supervisor that does not spread, or before it first
    /// joined).
    pub fn group(&self) -> Option<GroupStatus> {
        let status = lock(&self.status);
        status.group.clone().map(|mut g| {
            g.handovers = status.handovers.load(Ordering::Relaxed);
            g.leading = status
                .leading
                .iter()
                .filter(|(_, led)| **led)
                .map(|(n, _)| n.clone())
                .collect();
            g
        })
    }

    /// Whether this replica is a live member of its group now (`None` for a supervisor that does not spread):
    /// [`group`](Self::group)'s `is_member` without building the rest of the status, cheap enough to poll (the
    /// status of a replica of a large group lists thousands of names).
    pub fn is_member(&self) -> Option<bool> {
        lock(&self.status).group.as_ref().map(|g| g.is_member)
    }

    /// [`is_member`](Self::is_member) as a watch: its value now, and each change as it happens (a replica
    /// reporting when it joins or leaves its group waits on it instead of polling).
    pub fn membership(&self) -> tokio::sync::watch::Receiver<Option<bool>> {
        lock(&self.status).member.subscribe()
    }

    /// Store health, leadership per controller, and the group. It only reads: dropping the future is safe.
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            store: self.elector.health().await,
            leading: self.leading(),
            group: self.group(),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn set_leading(status: &Mutex<Status>, name: &str, value: bool) {
    lock(status).leading.insert(name.to_owned(), value);
}
