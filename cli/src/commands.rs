//! The operator commands, one function each: the reads (`audit`, `history`, `identity`; `status` and `tasks`
//! have a module of their own) and the writes (`audit prune`, `migrate`, `grant`, `revoke`, `force-release`),
//! on a store connected as the global options say, printing for people or, with `--json`, as JSON.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgfence::admin::RejectionFilter;
use pgfence::{ForceReleased, Store};

use crate::output::{emit, print_json};
use crate::{require_lease, split_lease, svg, table, CliResult, Failure, Global};

/// Prints to stderr what the database's advisory-lock and role layout lacks (docs/security.md), one escaped
/// line each; what would stop pgfence is refused by `migrate` and `grant` themselves.
async fn warn_layout(store: &Store) -> CliResult {
    for problem in store.admin().layout_problems().await? {
        let line = format!("{}. To fix: {}", problem.problem, problem.fix);
        eprintln!(
            "pgfence: warning: {}",
            table::escape(&line, table::MESSAGE_CHARS)
        );
    }
    Ok(())
}

/// Prints to stderr what the schema repair (`pgfence._harden`, run by every grant and revoke, and by `migrate`)
/// changed, one escaped line each: the names in it are other roles' text. Among them the advice to acquire again
/// after a dropped trigger, which would otherwise reach only the server's log.
fn warn_repairs(repairs: &[String]) {
    for repair in repairs {
        eprintln!(
            "pgfence: warning: {}",
            table::escape(repair, table::MESSAGE_CHARS)
        );
    }
}

pub(super) async fn audit_prune(global: &Global, older_than: Duration, batch: u32) -> CliResult {
    let store = global.store(&global.cluster).await?;
    let deleted = store.admin().prune_rejections(older_than, batch).await?;
    emit(&format!(
        "deleted {deleted} audit rows last seen more than {older_than:?} ago\n"
    ))
}

pub(super) async fn grant(
    global: &Global,
    role: String,
    clusters: Vec<String>,
    all_clusters: bool,
    operator: bool,
) -> CliResult {
    let store = global.store(&global.cluster).await?;
    let targets = cluster_targets(&clusters, all_clusters);
    let rights = if operator { "operator" } else { "application" };
    for cluster in targets {
        let repairs = if operator {
            store.admin().grant_operator(&role, cluster).await?
        } else {
            store.admin().grant_application(&role, cluster).await?
        };
        warn_repairs(&repairs);
        println!(
            "granted {} the {rights} rights on {}",
            role,
            cluster.map_or_else(|| "every cluster".to_owned(), |c| format!("cluster {}", c))
        );
    }
    warn_layout(&store).await
}

pub(super) async fn revoke(
    global: &Global,
    role: String,
    clusters: Vec<String>,
    all_clusters: bool,
) -> CliResult {
    let store = global.store(&global.cluster).await?;
    let targets = cluster_targets(&clusters, all_clusters);
    for cluster in targets {
        let revoked = store.admin().revoke(&role, cluster).await?;
        warn_repairs(&revoked.repairs);
        let on = cluster.map_or_else(|| "every cluster".to_owned(), |c| format!("cluster {}", c));
        if revoked.removed {
            println!("revoked {}'s grant on {on}", role);
        } else {
            println!("{} had no grant on {on}", role);
        }
    }
    Ok(())
}

pub(super) async fn audit(
    global: &Global,
    lease: Option<String>,
    since: Option<DateTime<Utc>>,
    limit: i64,
    json: bool,
) -> CliResult {
    if limit < 1 {
        return Err(Failure::new(2, "--limit must be at least 1"));
    }
    let (cluster, name) = match &lease {
        Some(lease) => {
            let (cluster, name) = split_lease(lease, &global.cluster);
            (cluster, Some(name))
        }
        None => (global.cluster.clone(), None),
    };
    let store = global.store(&cluster).await?;
    if let Some(name) = &name {
        require_lease(&store, name).await?;
    }
    let mut filter = RejectionFilter::default();
    filter.all_clusters = name.is_none();
    filter.lease = name;
    filter.since = since;
    filter.limit = Some(limit);
    let rows = store.admin().rejections(&filter).await?;
    if json {
        return print_json(&rows);
    }
    emit(&table::rejections(&rows))
}

pub(super) async fn history(
    global: &Global,
    lease: String,
    json: bool,
    picture: Option<PathBuf>,
) -> CliResult {
    let (cluster, name) = split_lease(&lease, &global.cluster);
    let store = global.store(&cluster).await?;
    require_lease(&store, &name).await?;
    let reviews = store.history().review(&name).await?;
    let attempts = store.effects().ledger(&name).await?;
    let qualified = format!("{cluster}/{name}");
    if let Some(path) = &picture {
        std::fs::write(path, svg::timeline(&qualified, &reviews))
            .map_err(|e| Failure::new(1, format!("cannot write {}: {e}", path.display())))?;
    }
    if json {
        return print_json(&crate::tasks::history_entries(&reviews, &attempts));
    }
    emit(&table::review(&qualified, &reviews, &attempts))
}

pub(super) async fn identity(global: &Global, json: bool) -> CliResult {
    let store = global.store(&global.cluster).await?;
    let identity = store.admin().identity().await?;
    if json {
        return print_json(&identity);
    }
    emit(&table::identity(&identity, store.admin().target()))
}

pub(super) async fn migrate(global: &Global) -> CliResult {
    let store = global.store(&global.cluster).await?;
    let applied = store.migrate().await?;
    // The repair, once the schema is known to be the owner's (migrate refuses it otherwise): what a careless
    // grant left since the last grant, revoke or migration goes, and the operator is told.
    warn_repairs(&store.admin().harden().await?);
    warn_layout(&store).await?;
    let target = table::value(store.admin().target());
    emit(&if applied.is_empty() {
        format!("pgfence schema is up to date on {target}\n")
    } else {
        format!(
            "applied migrations on {target}: {}\n",
            table::value(&applied.join(", "))
        )
    })
}

pub(super) async fn force_release(
    global: &Global,
    name: String,
    yes: bool,
    json: bool,
) -> CliResult {
    let (cluster, name) = split_lease(&name, &global.cluster);
    if !yes {
        return Err(Failure::new(
            2,
            format!(
                "force-release cuts off the current holder of {cluster}/{name}: repeat with --yes"
            ),
        ));
    }
    let store = global.store(&cluster).await?;
    let outcome = store.admin().force_release(&name).await?;
    if matches!(outcome, ForceReleased::Unknown) {
        return Err(Failure::new(6, format!("unknown lease {cluster}/{name}")));
    }
    if json {
        return print_json(&outcome);
    }
    let lease = table::value(&format!("{cluster}/{name}"));
    emit(&match outcome {
        ForceReleased::Ended { epoch, holder } => format!(
            "ended epoch {epoch} of {lease} (held by {}); writes presenting it are refused now, \
             and the next acquisition issues a larger epoch\n",
            table::value(&holder)
        ),
        _ => format!("{lease} was not held; nothing changed\n"),
    })
}

/// The clusters a grant or revocation names: each given one, or `None` (every cluster) for `--all-clusters`.
fn cluster_targets(clusters: &[String], all_clusters: bool) -> Vec<Option<&str>> {
    if all_clusters {
        vec![None]
    } else {
        clusters.iter().map(|c| Some(c.as_str())).collect()
    }
}
