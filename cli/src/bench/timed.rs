//! The measuring loop of every workload that runs in this process: its writers side by side for a set time,
//! each step's latency recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::workload::Writer;
use super::{new_histogram, Failure};

/// Runs `writers` for `duration`: each records every step's latency. Returns the writers (for the next round),
/// the steps done, the seconds it took and the merged latencies.
pub(super) async fn timed(
    writers: Vec<Writer>,
    duration: Duration,
) -> Result<(Vec<Writer>, u64, f64, Histogram<u64>), Failure> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|mut writer| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut latency = new_histogram();
                let mut steps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    writer.step().await?;
                    latency.saturating_record(t.elapsed().as_micros().max(1) as u64);
                    steps += 1;
                }
                Ok::<_, Failure>((writer, steps, latency))
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut writers = Vec::with_capacity(tasks.len());
    let mut steps = 0;
    let mut latency = new_histogram();
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok((w, n, h))) => {
                writers.push(w);
                steps += n;
                let _ = latency.add(&h);
            }
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(Failure::new(1, format!("a writer panicked: {e}"))),
        }
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    Ok((writers, steps, started.elapsed().as_secs_f64(), latency))
}
