//! The figures of one `pgfence bench` run: medians over interleaved rounds, latency percentiles, ratios, the
//! targets, the table on stdout and the JSON document.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::workload::{Path, Workload};

mod ledger;

/// One round of one workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Round {
    /// Transactions (round trips; for pgbench: script runs) completed.
    pub(super) transactions: u64,
    pub(super) seconds: f64,
    pub(super) tx_per_s: f64,
    /// MultiXact ids the server assigned during the round (cluster-wide).
    pub(super) multixacts: u64,
    /// Transaction ids the server assigned during the round (cluster-wide; write transactions only).
    pub(super) xids: u64,
}

/// Latency of one transaction as seen by the client, in milliseconds, over all rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Latency {
    pub(super) samples: u64,
    pub(super) mean: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) p999: f64,
    pub(super) max: f64,
}

impl Latency {
    fn from_histogram(h: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            samples: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// A ratio to another workload of the same run: the median over rounds of the per-round ratios when both ran
/// in the same rounds (paired, side by side), else the ratio of the medians.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Ratio {
    pub(super) baseline: String,
    pub(super) value: f64,
    pub(super) paired: bool,
}

/// Everything measured for one workload at one concurrency, batch size and lease table size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Measurement {
    pub(super) workload: String,
    pub(super) path: String,
    pub(super) guarded: bool,
    pub(super) description: String,
    /// Which run a measurement comes from, when a chart draws several (`--plot-from`): "fsync on", "fsync off".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) variant: Option<String>,
    pub(super) concurrency: u32,
    /// Rows per round trip (1 for task and lease workloads).
    pub(super) batch: u32,
    /// Rows of `pgfence.leases` (lease workloads only).
    pub(super) lease_rows: Option<u32>,
    pub(super) rounds: Vec<Round>,
    /// Median over rounds.
    pub(super) tx_per_s: f64,
    /// Median over rounds × batch.
    pub(super) rows_per_s: f64,
    pub(super) latency_ms: Latency,
    /// MultiXacts per transaction over all rounds (they drive anti-wraparound vacuums).
    pub(super) multixacts_per_tx: f64,
    /// Transaction ids per transaction over all rounds.
    pub(super) xids_per_tx: f64,
    /// Guarded ÷ the unguarded workload writing the same rows through the same pool with the same statements.
    pub(super) vs_unguarded: Option<Ratio>,
    /// ÷ the raw tokio-postgres workload sending the same guarded statement (the library's client path).
    pub(super) vs_raw: Option<Ratio>,
    /// ÷ pgbench sending the same guarded SQL at the same concurrency.
    pub(super) vs_pgbench: Option<Ratio>,
    /// Rows/s ÷ rows/s of the same workload at batch 1.
    pub(super) vs_batch1: Option<Ratio>,
    /// ÷ the peer guard of the same shape (`peer-for-share` for `fenced`, `peer-for-share-update` for
    /// `guarded-update`).
    pub(super) vs_peer: Option<Ratio>,
    /// ÷ the same number of guarded `append_event`s on the same task (`effect-pair` ÷ `event-pair`): the
    /// effect ledger's cost, as throughput (its inverse is the time an intent+outcome pair takes per two events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) vs_events: Option<Ratio>,
}

/// Collects rounds as they are measured.
#[derive(Default)]
pub(super) struct Collector {
    cells: BTreeMap<Key, Cell>,
    order: Vec<Key>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) workload: Workload,
    pub(super) concurrency: u32,
    pub(super) batch: u32,
    pub(super) lease_rows: Option<u32>,
}

struct Cell {
    rounds: Vec<Round>,
    latency: Histogram<u64>,
}

impl Collector {
    pub(super) fn add(&mut self, key: Key, round: Round, latency: &Histogram<u64>) {
        if !self.cells.contains_key(&key) {
            self.order.push(key);
        }
        let cell = self.cells.entry(key).or_insert_with(|| Cell {
            rounds: Vec::new(),
            latency: super::new_histogram(),
        });
        cell.rounds.push(round);
        let _ = cell.latency.add(latency);
    }

    /// Medians, percentiles and ratios of everything collected, in measurement order.
    pub(super) fn measurements(&self) -> Vec<Measurement> {
        let rates = |key: &Key| -> Option<Vec<f64>> {
            self.cells
                .get(key)
                .map(|c| c.rounds.iter().map(|r| r.tx_per_s).collect())
        };
        let ratio = |key: &Key, other: Key, scale: f64| -> Option<Ratio> {
            let (a, b) = (rates(key)?, rates(&other)?);
            // Same concurrency: both ran in the same interleaved rounds, so compare round by round.
            let paired = key.concurrency == other.concurrency && a.len() == b.len();
            let value = if paired {
                median(
                    a.iter()
                        .zip(&b)
                        .map(|(x, y)| x * scale / y)
                        .collect::<Vec<_>>(),
                )
            } else {
                median(a) * scale / median(b)
            };
            Some(Ratio {
                baseline: describe(other),
                value,
                paired,
            })
        };
        let mut out = Vec::new();
        for key in &self.order {
            let cell = &self.cells[key];
            // The ratio to another workload of the same concurrency, batch and lease table.
            let beside = |other: Option<Workload>| {
                other.and_then(|workload| ratio(key, Key { workload, ..*key }, 1.0))
            };
            let tx_per_s = median(cell.rounds.iter().map(|r| r.tx_per_s).collect());
            let transactions: u64 = cell.rounds.iter().map(|r| r.transactions).sum();
            let per_tx = |n: u64| n as f64 / transactions.max(1) as f64;
            let w = key.workload;
            out.push(Measurement {
                workload: w.name().to_owned(),
                path: w.path().as_str().to_owned(),
                guarded: w.guarded(),
                description: w.description().to_owned(),
                variant: None,
                concurrency: key.concurrency,
                batch: key.batch,
                lease_rows: key.lease_rows,
                rounds: cell.rounds.clone(),
                tx_per_s,
                rows_per_s: tx_per_s * f64::from(key.batch),
                latency_ms: Latency::from_histogram(&cell.latency),
                multixacts_per_tx: per_tx(cell.rounds.iter().map(|r| r.multixacts).sum()),
                xids_per_tx: per_tx(cell.rounds.iter().map(|r| r.xids).sum()),
                vs_unguarded: beside(w.unguarded()),
                vs_raw: beside(w.raw()),
                vs_pgbench: beside(w.pgbench()),
                vs_batch1: (key.batch > 1)
                    .then(|| ratio(key, Key { batch: 1, ..*key }, f64::from(key.batch)))
                    .flatten(),
                vs_peer: beside(w.peer_of_same_shape()),
                vs_events: beside(w.events()),
            });
        }
        out
    }
}

fn describe(key: Key) -> String {
    let mut text = format!(
        "{} c={} batch={}",
        key.workload.name(),
        key.concurrency,
        key.batch
    );
    if let Some(rows) = key.lease_rows {
        text.push_str(&format!(" lease_rows={rows}"));
    }
    text
}

pub(super) fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// What renewing many leases held by one process costs per tick (one `PgElector`, one holder).
#[derive(Debug, Clone, Serialize)]
pub(super) struct RenewalCost {
    pub(super) leases: u32,
    pub(super) lease_rows: u32,
    pub(super) renew_every_ms: u64,
    pub(super) window_s: f64,
    /// Renewal ticks seen by the server (`pgfence.renew_many` calls), or the expected number when counted by
    /// transaction ids.
    pub(super) ticks: u64,
    /// Every statement the server ran for the elector in the window.
    pub(super) statements: u64,
    pub(super) statements_per_tick: f64,
    pub(super) leases_renewed_per_tick: f64,
    /// Mean server execution time of one tick's renewal statement, when pg_stat_statements is available.
    pub(super) server_ms_per_tick: Option<f64>,
    /// `pg_stat_statements`, or `xids` (write transactions) when it is not loaded.
    pub(super) counted_by: &'static str,
    pub(super) by_statement: Vec<(String, u64)>,
}

/// Server execution time of one statement, measured one at a time (no concurrency), from
/// `pg_stat_statements`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ServerCost {
    pub(super) statement: &'static str,
    pub(super) calls: u64,
    pub(super) mean_us: f64,
    pub(super) wal_records_per_call: f64,
    pub(super) wal_bytes_per_call: f64,
}

/// One performance target of the issue and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Target {
    pub(super) target: String,
    pub(super) met: bool,
    pub(super) measured: Vec<String>,
}

fn find(
    all: &[Measurement],
    workload: Workload,
    concurrency: u32,
    batch: u32,
) -> Option<&Measurement> {
    all.iter().find(|m| {
        m.workload == workload.name()
            && m.concurrency == concurrency
            && m.batch == batch
            && m.lease_rows.is_none()
    })
}

/// Judges the targets on what was measured (a target whose workloads did not run is left out).
pub(super) fn targets(all: &[Measurement], renewal: Option<&RenewalCost>) -> Vec<Target> {
    let mut out = Vec::new();
    let mut concurrencies: Vec<u32> = all.iter().map(|m| m.concurrency).collect();
    concurrencies.sort_unstable();
    concurrencies.dedup();

    let mut ratio_target = |text: &str,
                            threshold: f64,
                            pick: &dyn Fn(&Measurement) -> Option<&Ratio>,
                            workloads: &[Workload],
                            batch: Option<u32>| {
        let mut measured = Vec::new();
        let mut met = true;
        for m in all.iter().filter(|m| {
            workloads.iter().any(|w| w.name() == m.workload)
                && batch.is_none_or(|b| m.batch == b)
                && m.lease_rows.is_none()
        }) {
            if let Some(r) = pick(m) {
                met &= r.value >= threshold;
                measured.push(format!(
                    "{} c={} b={}: {:.2}",
                    m.workload, m.concurrency, m.batch, r.value
                ));
            }
        }
        if !measured.is_empty() {
            out.push(Target {
                target: text.to_owned(),
                met,
                measured,
            });
        }
    };
    ratio_target(
        "the portable guard: guarded-update (Store::guarded_write, one statement) ≥ 0.6 × update (same rows, \
         same pool)",
        0.6,
        &|m| m.vs_unguarded.as_ref(),
        &[Workload::GuardedUpdate],
        Some(1),
    );
    ratio_target(
        "the native guard: guarded-update-native ≥ 0.90 × update (same rows, same pool)",
        0.9,
        &|m| m.vs_unguarded.as_ref(),
        &[Workload::GuardedUpdateNative],
        Some(1),
    );
    ratio_target(
        "pgfence's guarded write ≥ the share-lock peer of the same shape (fenced ÷ peer-for-share, \
         guarded-update ÷ peer-for-share-update; each guard)",
        1.0,
        &|m| m.vs_peer.as_ref(),
        &[
            Workload::Fenced,
            Workload::FencedNative,
            Workload::GuardedUpdate,
            Workload::GuardedUpdateNative,
        ],
        Some(1),
    );
    ratio_target(
        "fenced ≥ 0.90 × tx (same statements, same pool; each guard)",
        0.90,
        &|m| m.vs_unguarded.as_ref(),
        &[Workload::Fenced, Workload::FencedNative],
        Some(1),
    );
    ratio_target(
        "append ≥ 0.90 × append-unguarded (the same writes without the guard, same pool)",
        0.90,
        &|m| m.vs_unguarded.as_ref(),
        &[Workload::Append],
        None,
    );
    ratio_target(
        "append ≥ 0.90 × raw-append (the same statement through tokio-postgres, prepared)",
        0.90,
        &|m| m.vs_raw.as_ref(),
        &[Workload::Append],
        None,
    );
    let max_batch = all.iter().map(|m| m.batch).max().unwrap_or(1);
    if max_batch >= 100 {
        ratio_target(
            &format!("{max_batch}-row batched guarded writes ≥ 30 × single-row rows/s"),
            30.0,
            &|m| {
                (m.batch == max_batch)
                    .then_some(m.vs_batch1.as_ref())
                    .flatten()
            },
            &[Workload::Fenced, Workload::GuardedUpdate],
            Some(max_batch),
        );
    }
    let is_peer = |m: &Measurement| Workload::parse(&m.workload).is_some_and(Workload::peer);
    let guarded: Vec<&Measurement> = all
        .iter()
        .filter(|m| {
            m.guarded && !is_peer(m) && m.lease_rows.is_none() && m.path == Path::Pool.as_str()
        })
        .collect();
    if !guarded.is_empty() {
        let worst = guarded
            .iter()
            .map(|m| m.multixacts_per_tx)
            .fold(0.0f64, f64::max);
        let mut measured = vec![format!(
            "pgfence: at most {worst:.3} per transaction over {} guarded pool measurements (cluster-wide \
             count, so background activity shows too)",
            guarded.len()
        )];
        for m in all.iter().filter(|m| is_peer(m) && m.batch == 1) {
            measured.push(format!(
                "{} c={}: {:.2} per transaction",
                m.workload, m.concurrency, m.multixacts_per_tx
            ));
        }
        out.push(Target {
            target: "MultiXacts per guarded write: 0 (the guard takes no row lock; the share-lock peers, for \
                     comparison, below)"
                .to_owned(),
            met: worst < 0.01,
            measured,
        });
    }
    if let Some(r) = renewal {
        out.push(Target {
            target: format!(
                "renewing {} leases held by one process costs ≤ 2 statements per tick",
                r.leases
            ),
            met: r.statements_per_tick <= 2.0,
            measured: vec![format!(
                "{:.2} statements per tick ({} statements in {} ticks, counted by {}), {:.0} leases renewed per tick",
                r.statements_per_tick, r.statements, r.ticks, r.counted_by, r.leases_renewed_per_tick
            )],
        });
    }
    for op in [Workload::Acquire, Workload::Renew] {
        let mut rows: Vec<&Measurement> = all
            .iter()
            .filter(|m| m.workload == op.name() && m.concurrency == concurrencies[0])
            .collect();
        rows.sort_by_key(|m| m.lease_rows);
        if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
            if first.lease_rows != last.lease_rows {
                let growth = last.latency_ms.p50 / first.latency_ms.p50;
                out.push(Target {
                    target: format!(
                        "{} latency flat from {} to {} lease rows (p50 within 25 %, c={})",
                        op.name(),
                        first.lease_rows.unwrap_or(0),
                        last.lease_rows.unwrap_or(0),
                        first.concurrency
                    ),
                    met: growth <= 1.25,
                    measured: rows
                        .iter()
                        .map(|m| {
                            format!(
                                "{} rows: p50 {:.3} ms, p99 {:.3} ms",
                                m.lease_rows.unwrap_or(0),
                                m.latency_ms.p50,
                                m.latency_ms.p99
                            )
                        })
                        .collect(),
                });
            }
        }
    }
    if concurrencies.contains(&16) && concurrencies.contains(&64) {
        let mut measured = Vec::new();
        let mut met = true;
        for w in [
            Workload::Append,
            Workload::Fenced,
            Workload::ClaimTransition,
            Workload::Update,
            Workload::AppendUnguarded,
            Workload::AppendOwnLease,
            Workload::PgbenchAppend,
        ] {
            if let (Some(at16), Some(at64)) = (find(all, w, 16, 1), find(all, w, 64, 1)) {
                let r = at64.tx_per_s / at16.tx_per_s;
                let hot = w.guarded() && w.path() == Path::Pool && w != Workload::AppendOwnLease;
                if hot {
                    met &= r >= 0.8;
                }
                measured.push(format!(
                    "{}: {:.0} tx/s at 64 ÷ {:.0} at 16 = {:.2}{}",
                    w.name(),
                    at64.tx_per_s,
                    at16.tx_per_s,
                    r,
                    if hot {
                        ""
                    } else {
                        " (reference, no hot lease)"
                    }
                ));
            }
        }
        if !measured.is_empty() {
            out.push(Target {
                target: "no collapse on one hot lease: 64 writers ≥ 0.8 × 16 writers".to_owned(),
                met,
                measured,
            });
        }
    }
    out
}

fn ratio_cell(r: &Option<Ratio>) -> String {
    r.as_ref()
        .map_or_else(|| "-".to_owned(), |r| format!("{:.2}", r.value))
}

fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The tables on stdout: writes per batch size, then leases, then the renewal cost and the targets.
pub(super) fn print_tables(
    all: &[Measurement],
    renewal: Option<&RenewalCost>,
    server: &[ServerCost],
    targets: &[Target],
) {
    let mut batches: Vec<u32> = all
        .iter()
        .filter(|m| m.lease_rows.is_none())
        .map(|m| m.batch)
        .collect();
    batches.sort_unstable();
    batches.dedup();
    for batch in batches {
        println!();
        println!(
            "Writes, {batch} row{} per round trip (medians over rounds; ratios paired round by round)",
            if batch == 1 { "" } else { "s" }
        );
        let mut rows: Vec<&Measurement> = all
            .iter()
            .filter(|m| m.lease_rows.is_none() && m.batch == batch)
            .collect();
        rows.sort_by_key(|m| {
            (
                Workload::parse(&m.workload).map(|w| w as usize),
                m.concurrency,
            )
        });
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|m| {
                vec![
                    m.workload.to_owned(),
                    m.path.to_owned(),
                    m.concurrency.to_string(),
                    rate(m.tx_per_s),
                    rate(m.rows_per_s),
                    format!("{:.3}", m.latency_ms.p50),
                    format!("{:.3}", m.latency_ms.p99),
                    format!("{:.3}", m.latency_ms.p999),
                    format!("{:.2}", m.multixacts_per_tx),
                    ratio_cell(&m.vs_unguarded),
                    ratio_cell(&m.vs_raw),
                    ratio_cell(&m.vs_pgbench),
                    ratio_cell(&m.vs_batch1),
                    ratio_cell(&m.vs_peer),
                ]
            })
            .collect();
        super::super::table::print(
            &[
                "WORKLOAD",
                "PATH",
                "C",
                "TX/S",
                "ROWS/S",
                "P50 MS",
                "P99 MS",
                "P99.9 MS",
                "MXID/TX",
                "÷UNGUARDED",
                "÷RAW",
                "÷PGBENCH",
                "×BATCH 1",
                "÷PEER",
            ],
            &table,
        );
    }
    let leases: Vec<&Measurement> = all.iter().filter(|m| m.lease_rows.is_some()).collect();
    if !leases.is_empty() {
        println!();
        println!("Leases: acquire and renew by the size of pgfence.leases (medians over rounds)");
        let mut rows = leases.clone();
        rows.sort_by_key(|m| {
            (
                Workload::parse(&m.workload).map(|w| w as usize),
                m.concurrency,
                m.lease_rows,
            )
        });
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|m| {
                vec![
                    m.workload.to_owned(),
                    m.lease_rows.unwrap_or(0).to_string(),
                    m.concurrency.to_string(),
                    rate(m.tx_per_s),
                    format!("{:.3}", m.latency_ms.p50),
                    format!("{:.3}", m.latency_ms.p99),
                    format!("{:.3}", m.latency_ms.p999),
                    format!("{:.2}", m.multixacts_per_tx),
                ]
            })
            .collect();
        super::super::table::print(
            &[
                "WORKLOAD", "LEASES", "C", "OPS/S", "P50 MS", "P99 MS", "P99.9 MS", "MXID/OP",
            ],
            &table,
        );
    }
    ledger::print_cost(all);
    if let Some(r) = renewal {
        println!();
        println!(
            "Renewal of {} leases held by one process (PgElector, renew every {} ms, {} lease rows): \
             {:.2} statements per tick, {:.0} leases per statement{}",
            r.leases,
            r.renew_every_ms,
            r.lease_rows,
            r.statements_per_tick,
            r.leases_renewed_per_tick,
            r.server_ms_per_tick
                .map(|ms| format!(", {ms:.2} ms server time per tick"))
                .unwrap_or_default()
        );
    }
    if !server.is_empty() {
        println!();
        println!("Server time per statement, one at a time (pg_stat_statements)");
        let table: Vec<Vec<String>> = server
            .iter()
            .map(|s| {
                vec![
                    s.statement.to_owned(),
                    s.calls.to_string(),
                    format!("{:.1}", s.mean_us),
                    format!("{:.1}", s.wal_records_per_call),
                    format!("{:.0}", s.wal_bytes_per_call),
                ]
            })
            .collect();
        super::super::table::print(
            &["STATEMENT", "CALLS", "MEAN µS", "WAL RECORDS", "WAL BYTES"],
            &table,
        );
    }
    if !targets.is_empty() {
        println!();
        println!("Targets");
        for t in targets {
            println!("  [{}] {}", if t.met { "met" } else { "MISSED" }, t.target);
            for line in &t.measured {
                println!("        {line}");
            }
        }
    }
}

/// Which paths a workload list covers, for the header.
pub(super) fn paths(workloads: &[Workload]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for p in [Path::Pool, Path::Raw, Path::Pgbench] {
        if workloads.iter().any(|w| w.path() == p) {
            out.push(p.as_str());
        }
    }
    out
}
