//! The states tests start from, each reached in one line through the public API (never by writing pgfence's
//! tables): a held lease at a given epoch, a takeover, an application role with its grant. A test then states
//! only what it checks.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use pgfence::{Lease, Store};

use super::{role, store_as, TestDb};

/// The ttl of fixture leases unless a test names one: long enough that no lease expires during a test.
pub const TTL: Duration = Duration::from_secs(60);

/// A held lease of `name` on `store`, held by "pod-a" for [`TTL`] unless the builder says otherwise; await it.
pub fn lease<'a>(store: &'a Store, name: &'a str) -> LeaseFixture<'a> {
    LeaseFixture {
        store,
        name,
        holder: "pod-a",
        ttl: TTL,
        epoch: None,
    }
}

/// What [`lease`] builds: awaiting it acquires the lease.
pub struct LeaseFixture<'a> {
    store: &'a Store,
    name: &'a str,
    holder: &'a str,
    ttl: Duration,
    epoch: Option<i64>,
}

impl<'a> LeaseFixture<'a> {
    pub fn holder(mut self, holder: &'a str) -> Self {
        self.holder = holder;
        self
    }

    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The tenure is the lease's `epoch`-th: the holder acquires the lease again until it is (each acquisition
    /// supersedes the one before, so the earlier tenures are real and their fences stale as superseded).
    pub fn epoch(mut self, epoch: i64) -> Self {
        self.epoch = Some(epoch);
        self
    }
}

impl<'a> IntoFuture for LeaseFixture<'a> {
    type Output = Lease;
    type IntoFuture = Pin<Box<dyn Future<Output = Lease> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let mut lease = self
                .store
                .acquire(self.name, self.holder, self.ttl)
                .await
                .unwrap();
            if let Some(epoch) = self.epoch {
                while lease.epoch().get() < epoch {
                    lease = self
                        .store
                        .acquire(self.name, self.holder, self.ttl)
                        .await
                        .unwrap();
                }
                assert_eq!(
                    lease.epoch().get(),
                    epoch,
                    "{}: epoch past the fixture's",
                    self.name
                );
            }
            lease
        })
    }
}

/// A takeover of `name` on `store`: the operator force-releases the current tenure and `successor` acquires
/// the next one (for [`TTL`]). Fences of the earlier tenure are stale from here on.
pub async fn take_over(store: &Store, name: &str, successor: &str) -> Lease {
    store.admin().force_release(name).await.unwrap();
    store.acquire(name, successor, TTL).await.unwrap()
}

/// A login role `<database>_<suffix>` (see [`role`]) that `owner` granted the application rights on `cluster`
/// (`None`: every cluster).
pub async fn app_role(db: &TestDb, owner: &Store, suffix: &str, cluster: Option<&str>) -> String {
    let name = role(db, suffix).await;
    owner
        .admin()
        .grant_application(&name, cluster)
        .await
        .unwrap();
    name
}

/// [`app_role`] granted `cluster`, and a store of `cluster` logged in as it: (role, store).
pub async fn app_store(db: &TestDb, owner: &Store, suffix: &str, cluster: &str) -> (String, Store) {
    let name = app_role(db, owner, suffix, Some(cluster)).await;
    let store = store_as(db, &name, cluster).await;
    (name, store)
}
