//! [`Supervisor`]: several controllers, each campaigning for its own lease, restarted with backoff.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::Backoff;
use super::held::Health;
use super::run::{run_with_leadership, Ended, LeaderContext, LeadershipOptions};
use super::Elector;

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The error type of supervised controllers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type Factory =
    Arc<dyn Fn(LeaderContext) -> BoxFuture<std::result::Result<(), BoxError>> + Send + Sync>;

struct Controller {
    name: String,
    options: LeadershipOptions,
    factory: Factory,
}

/// Runs several controllers in one process, each with its own lease and campaign loop: the leadership of each
/// name is independent (this process may lead `scheduler` while another leads `rollout`). After a loss or a
/// failure a controller re-campaigns after an exponential [`Backoff`] with equal jitter; shutdown stops every loop and
/// releases what is held.
pub struct Supervisor<E: Elector> {
    elector: E,
    holder: String,
    backoff: Backoff,
    controllers: Vec<Controller>,
    leading: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl<E: Elector> fmt::Debug for Supervisor<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("holder", &self.holder)
            .field(
                "controllers",
                &self.controllers.iter().map(|c| &c.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Readiness in separate dimensions: the store, and per controller whether this process leads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Readiness {
    /// The backing store's health.
    pub store: Health,
    /// Controller name → leading now.
    pub leading: BTreeMap<String, bool>,
}

/// A handle to a running supervisor's status.
#[derive(Debug, Clone)]
pub struct SupervisorStatus<E: Elector> {
    elector: E,
    leading: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl<E: Elector> SupervisorStatus<E> {
    /// Which controllers this process leads now.
    pub fn leading(&self) -> BTreeMap<String, bool> {
        self.leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Store health plus leadership per controller. It only reads: dropping the future is safe.
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            store: self.elector.health().await,
            leading: self.leading(),
        }
    }
}

impl<E: Elector> Supervisor<E> {
    /// A supervisor whose leases are held as `holder` (e.g. the pod name).
    pub fn new(elector: E, holder: impl Into<String>) -> Supervisor<E> {
        Supervisor {
            elector,
            holder: holder.into(),
            backoff: Backoff::default(),
            controllers: Vec::new(),
            leading: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The re-campaign backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Adds a controller: `run` is called once per tenure with that tenure's context and should return when the
    /// context is cancelled.
    pub fn controller<F, Fut>(
        mut self,
        name: impl Into<String>,
        options: LeadershipOptions,
        run: F,
    ) -> Self
    where
        F: Fn(LeaderContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        let name = name.into();
        self.leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), false);
        self.controllers.push(Controller {
            name,
            options,
            factory: Arc::new(move |ctx| Box::pin(run(ctx))),
        });
        self
    }

    /// A status handle usable while [`run`](Self::run) runs.
    pub fn status(&self) -> SupervisorStatus<E> {
        SupervisorStatus {
            elector: self.elector.clone(),
            leading: self.leading.clone(),
        }
    }

    /// Runs every controller's campaign loop until `shutdown` is cancelled, then returns once every controller
    /// stopped and released its lease. Each controller's loop runs in a span `controller` with its name.
    ///
    /// # Cancel safety
    ///
    /// Prefer cancelling `shutdown`: it gives every callback its grace period. Dropping the future instead aborts
    /// every campaign: each lease held is released in the background and each callback is aborted at its next
    /// await point, as when [`run_with_leadership`] is dropped.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut loops = tokio::task::JoinSet::new();
        for controller in self.controllers {
            let (elector, holder, backoff, leading, shutdown) = (
                self.elector.clone(),
                self.holder.clone(),
                self.backoff,
                self.leading.clone(),
                shutdown.clone(),
            );
            let span = tracing::info_span!("controller", controller = %controller.name);
            loops.spawn(
                campaign(elector, holder, backoff, leading, shutdown, controller).instrument(span),
            );
        }
        while loops.join_next().await.is_some() {}
    }
}

async fn campaign<E: Elector>(
    elector: E,
    holder: String,
    backoff: Backoff,
    leading: Arc<Mutex<BTreeMap<String, bool>>>,
    shutdown: CancellationToken,
    controller: Controller,
) {
    let set_leading = |value: bool| {
        leading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(controller.name.clone(), value);
    };
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let factory = controller.factory.clone();
        let leading_flag = leading.clone();
        let name = controller.name.clone();
        let result = run_with_leadership(
            &elector,
            &controller.name,
            &holder,
            &controller.options,
            &shutdown,
            move |ctx| {
                leading_flag
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone(), true);
                // Not leading from the moment the tenure ends (loss or shutdown), not only once the callback
                // has returned.
                let token = ctx.cancellation_token();
                tokio::spawn(async move {
                    token.cancelled().await;
                    leading_flag
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, false);
                });
                factory(ctx)
            },
        )
        .await;
        set_leading(false);
        let delay = match result {
            Ok(Ended::Cancelled { .. }) => break,
            Ok(Ended::Returned) => {
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Lost { cause, .. }) => {
                tracing::warn!(controller = %controller.name, %cause, "re-campaigning after loss");
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Failed(e)) => {
                tracing::error!(controller = %controller.name, error = %e, "controller failed");
                failures += 1;
                backoff.delay(failures)
            }
            Ok(Ended::Panicked(message)) => {
                tracing::error!(controller = %controller.name, %message, "controller panicked");
                failures += 1;
                backoff.delay(failures)
            }
            Err(e) => {
                tracing::error!(controller = %controller.name, error = %e, "campaign failed");
                failures += 1;
                backoff.delay(failures)
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
