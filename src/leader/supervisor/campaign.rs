//! One controller's campaign without a group: acquire, lead, and campaign again with backoff after every tenure,
//! for as long as the supervisor runs; and what a controller is ([`Controller`], [`BoxError`]).

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::status::{set_leading, Status};
use crate::leader::backoff::Backoff;
use crate::leader::run::{run_leadership, Ended, LeaderContext, LeadershipOptions};
use crate::leader::{BoxFuture, Elector};

/// The error type of supervised controllers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

pub(super) type Factory =
    Arc<dyn Fn(LeaderContext) -> BoxFuture<std::result::Result<(), BoxError>> + Send + Sync>;

/// A controller as added: its name, its leadership options and the factory of its callback.
#[derive(Clone)]
pub(super) struct Controller {
    pub(super) name: String,
    pub(super) options: LeadershipOptions,
    pub(super) factory: Factory,
}

/// Campaigns for `controller` until `shutdown`: every replica that runs it competes for the name, and the one
/// that acquires it leads until its tenure ends.
pub(super) async fn campaign<E: Elector>(
    elector: E,
    holder: String,
    backoff: Backoff,
    status: Arc<Mutex<Status>>,
    shutdown: CancellationToken,
    controller: Controller,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let factory = controller.factory.clone();
        let status_flag = status.clone();
        let name = controller.name.clone();
        let result = run_leadership(
            &elector,
            &controller.name,
            &holder,
            &controller.options,
            &shutdown,
            None,
            move |ctx| {
                set_leading(&status_flag, &name, true);
                // Not leading from the moment the tenure ends (loss or shutdown), not only once the callback
                // has returned.
                let token = ctx.cancellation_token();
                tokio::spawn(async move {
                    token.cancelled().await;
                    set_leading(&status_flag, &name, false);
                });
                factory(ctx)
            },
        )
        .await;
        set_leading(&status, &controller.name, false);
        let delay = match result {
            Ok(Ended::Cancelled { .. }) => break,
            Ok(Ended::Returned) => {
                failures = 0;
                backoff.delay(0)
            }
            Ok(Ended::Lost { end, .. }) => {
                tracing::warn!(controller = %controller.name, cause = %end, "re-campaigning after loss");
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
