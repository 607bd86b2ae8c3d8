//! What `pgfence bench` was asked to measure: the options checked and cleaned into a plan, the slots of one
//! round, the connections the plan needs and about how long it runs.

use std::time::Duration;

use super::workload::{self, Workload};
use super::{BenchArgs, Failure};

/// What the command was asked to measure.
pub(super) struct Plan {
    pub(super) duration: Duration,
    pub(super) rounds: u32,
    pub(super) concurrency: Vec<u32>,
    pub(super) batches: Vec<u32>,
    pub(super) lease_rows: Vec<u32>,
    pub(super) writes: Vec<Workload>,
    pub(super) leases: Vec<Workload>,
    /// Leases held by one process for the renewal measurement (0: skipped).
    pub(super) renewal_leases: u32,
    /// Takeovers per guard (0: skipped).
    pub(super) takeovers: u32,
}

impl Plan {
    pub(super) fn new(args: &BenchArgs, pgbench: bool) -> Result<Plan, Failure> {
        let usage = |m: String| Failure::new(2, m);
        let clean = |mut v: Vec<u32>, what: &str, max: u32| -> Result<Vec<u32>, Failure> {
            v.sort_unstable();
            v.dedup();
            v.retain(|&n| n > 0);
            if v.iter().any(|&n| n > max) {
                return Err(usage(format!("--{what} values must be at most {max}")));
            }
            Ok(v)
        };
        let concurrency = clean(args.concurrency.clone(), "concurrency", 512)?;
        let batches = clean(args.batch.clone(), "batch", 10_000)?;
        let lease_rows = clean(args.lease_rows.clone(), "lease-rows", 10_000_000)?;
        if concurrency.is_empty() || batches.is_empty() {
            return Err(usage(
                "--concurrency and --batch need at least one positive value".into(),
            ));
        }
        if args.rounds == 0 {
            return Err(usage("--rounds must be at least 1".into()));
        }
        let selected: Vec<Workload> = match &args.workloads {
            None => Workload::all().collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    Workload::parse(n.trim()).ok_or_else(|| {
                        usage(format!(
                            "unknown workload {n:?}; known: {}",
                            Workload::all()
                                .map(Workload::name)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let writes: Vec<Workload> = workload::WRITES
            .into_iter()
            .filter(|w| selected.contains(w))
            .filter(|w| pgbench || w.path() != workload::Path::Pgbench)
            .collect();
        let leases: Vec<Workload> = if lease_rows.is_empty() {
            Vec::new()
        } else {
            workload::LEASES
                .into_iter()
                .filter(|w| selected.contains(w))
                .collect()
        };
        if writes.is_empty() && leases.is_empty() {
            return Err(usage("no workload left to run".into()));
        }
        Ok(Plan {
            duration: args.duration,
            rounds: args.rounds,
            concurrency,
            batches,
            lease_rows,
            writes,
            leases,
            renewal_leases: args.renewal_leases,
            takeovers: args.takeovers,
        })
    }

    pub(super) fn max_concurrency(&self) -> u32 {
        *self.concurrency.last().expect("at least one")
    }

    pub(super) fn max_batch(&self) -> u32 {
        *self.batches.last().expect("at least one")
    }

    /// (workload, batch) pairs of one round of writes.
    pub(super) fn write_slots(&self) -> Vec<(Workload, u32)> {
        let mut slots = Vec::new();
        for &b in &self.batches {
            for &w in &self.writes {
                if b == 1 || w.batches() {
                    slots.push((w, b));
                }
            }
        }
        slots
    }

    /// (workload, lease rows) pairs of one round of lease operations.
    pub(super) fn lease_slots(&self) -> Vec<(Workload, u32)> {
        let mut slots = Vec::new();
        for &w in &self.leases {
            for &n in &self.lease_rows {
                slots.push((w, n));
            }
        }
        slots
    }

    /// Connections open at once: the pool, the pinging pool of `update-ping`, the native guard's pool, the raw
    /// clients and pgbench; or one pool per lease table.
    pub(super) fn connections_needed(&self) -> u32 {
        let per_writer = 5.max(if self.leases.is_empty() {
            0
        } else {
            self.lease_rows.len() as u32
        });
        self.max_concurrency() * per_writer + 10
    }

    pub(super) fn steps(&self) -> u64 {
        let c = self.concurrency.len() as u64;
        let per_round = (self.write_slots().len() + self.lease_slots().len()) as u64;
        c * per_round * u64::from(self.rounds)
    }

    pub(super) fn estimate(&self) -> Duration {
        let pgbench_round = Duration::from_secs_f64(self.duration.as_secs_f64().round().max(1.0))
            + Duration::from_millis(300);
        let mut total = Duration::ZERO;
        for (w, _) in self.write_slots() {
            total += if w.path() == workload::Path::Pgbench {
                pgbench_round
            } else {
                self.duration
            };
        }
        total += self.duration * self.lease_slots().len() as u32;
        total * (self.rounds * self.concurrency.len() as u32)
    }
}
