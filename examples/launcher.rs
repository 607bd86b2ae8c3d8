//! A controller that launches workloads on an external engine, and never launches one twice or loses one when
//! leadership moves while a launch is in flight.
//!
//! For each task it records the **intent** under its fence before calling the engine, and the **outcome** after.
//! A new tenure first settles what the one before it left **in doubt** — an intent without an outcome — by asking
//! the engine about the effect key: confirmed when the engine has it, retried under the same key when it does
//! not. The first leader here "crashes" between its call and its outcome (the engine applied the launch, the reply
//! was lost); the second finds the launch in doubt, asks, and confirms it: one workload, not two.
//!
//! The engine is a stand-in kept in this process (a map from idempotency key to workload); a real one is an HTTP or
//! RPC service that accepts an idempotency key and can be asked about it. The pattern is the same.
//!
//! Run with `cargo run --example launcher` (needs the PostgreSQL server binaries; or set DATABASE_URL).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgfence::effects::{EffectConflict, InDoubt, Outcome, Settlement};
use pgfence::leader::{run_with_leadership, BoxError, LeaderContext, LeadershipOptions, PgElector};
use pgfence::tasks::TaskState;
use pgfence::{Error, Store, StoreConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The workload engine: launches a workload once per idempotency key, and says what it launched for a key.
#[derive(Clone, Default)]
struct Engine {
    launched: Arc<Mutex<HashMap<String, String>>>,
}

impl Engine {
    /// Launches (or, for a key it has seen, answers the workload it launched then).
    fn launch(&self, key: &str) -> String {
        let mut launched = self.launched.lock().unwrap();
        let next = format!("w-{}", launched.len() + 1);
        launched.entry(key.to_owned()).or_insert(next).clone()
    }

    fn lookup(&self, key: &str) -> Option<String> {
        self.launched.lock().unwrap().get(key).cloned()
    }
}

/// Settles one effect an ended tenure left in doubt: ask the engine by the key, then confirm or retry.
async fn settle(
    store: &Store,
    ctx: &LeaderContext,
    engine: &Engine,
    doubt: &InDoubt,
) -> Result<(), BoxError> {
    let key = &doubt.effect.key;
    let ledger = store.effects();
    match engine.lookup(key) {
        Some(workload) => {
            println!(
                "  {key}: in doubt; the engine has {workload}: confirmed (not launched again)"
            );
            ledger
                .settle(
                    &ctx.fence(),
                    key,
                    &Settlement::Confirmed {
                        observed: json!({ "workload": workload }),
                    },
                )
                .await?;
        }
        None => {
            println!("  {key}: in doubt; the engine has no such key: retried under the same key");
            let retry = ledger
                .settle(
                    &ctx.fence(),
                    key,
                    &Settlement::Retry {
                        observed: json!({ "workload": null }),
                    },
                )
                .await?;
            let workload = engine.launch(&retry.effect.key);
            ledger
                .record_outcome(
                    &ctx.fence(),
                    &retry.effect.key,
                    &Outcome::Done(json!({ "workload": workload })),
                )
                .await?;
        }
    }
    Ok(())
}

/// A tenure's work: settle what is in doubt first, then launch each pending task's workload.
async fn lead(
    store: Store,
    ctx: LeaderContext,
    engine: Engine,
    crash_after_call: bool,
) -> Result<(), BoxError> {
    println!(
        "leading with epoch {}; {} effect(s) in doubt",
        ctx.epoch(),
        ctx.in_doubt().len()
    );
    for doubt in ctx.in_doubt() {
        settle(&store, &ctx, &engine, doubt).await?;
    }
    let fence = ctx.fence();
    for task in ["deploy-api", "deploy-web"] {
        if !ctx.is_held() {
            break;
        }
        store.tasks().create(&fence, task, &json!({})).await?;
        let key = format!("{task}/launch");
        // The intent first: a tenure that has ended is refused here, before it calls anything.
        match store
            .effects()
            .intend(&fence, task, &key, &json!({ "image": task }))
            .await
        {
            Ok(_) => {
                let workload = engine.launch(&key);
                if crash_after_call {
                    println!(
                        "  {key}: launched {workload} — and the leader crashes before recording it"
                    );
                    return Ok(());
                }
                store
                    .effects()
                    .record_outcome(
                        &fence,
                        &key,
                        &Outcome::Done(json!({ "workload": workload })),
                    )
                    .await?;
                println!("  {key}: launched {workload}");
            }
            // Launched already (done, or confirmed by the settle above): only the task's state is left.
            Err(Error::EffectConflict {
                reason: EffectConflict::Done,
                ..
            }) => {}
            Err(e) => return Err(e.into()),
        }
        store
            .tasks()
            .transition(
                &fence,
                task,
                TaskState::Pending,
                TaskState::Succeeded,
                &json!({}),
            )
            .await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server;
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) => url,
        Err(_) => {
            server = pgfence::embedded::EmbeddedServer::start()?;
            server.url()
        }
    };
    let store = Store::connect(StoreConfig::new(url, "launcher")).await?;
    store.migrate().await?;
    let elector = PgElector::new(store.clone());
    let engine = Engine::default();
    let options = LeadershipOptions::new(Duration::from_secs(5));
    for (holder, crash) in [("process-a", true), ("process-b", false)] {
        let (store, engine) = (store.clone(), engine.clone());
        run_with_leadership(
            &elector,
            "launcher",
            holder,
            &options,
            &CancellationToken::new(),
            move |ctx| lead(store, ctx, engine, crash),
        )
        .await?;
    }
    let launched = engine.launched.lock().unwrap().clone();
    println!(
        "the engine launched {} workloads for 2 tasks: {launched:?}",
        launched.len()
    );
    assert_eq!(launched.len(), 2, "one workload per task");
    Ok(())
}
