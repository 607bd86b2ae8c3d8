//! The overlap review: each tenure against its successor, its holder's belief placed on the database's time
//! line through the clock bounds its reports allow, and the refusals that prove an overlap by the database's
//! clock alone. Pure: no I/O, no clock.

use super::{Interval, OffsetBounds, Overlap, Successor, Tenure, TenureReview, CLOCK_DRIFT_PPM};
use crate::audit::Rejection;

/// The review of a lease's tenures (oldest first) against its tenure-scope refusals.
pub(super) fn review(tenures: Vec<Tenure>, refusals: &[Rejection]) -> Vec<TenureReview> {
    let successors: Vec<Option<Successor>> = (0..tenures.len())
        .map(|i| {
            tenures.get(i + 1).map(|next| Successor {
                epoch: next.epoch,
                holder: next.holder.clone(),
                acquired_at: next.acquired_at,
            })
        })
        .collect();
    tenures
        .into_iter()
        .zip(successors)
        .map(|(tenure, successor)| review_one(tenure, successor, refusals))
        .collect()
}

fn review_one(
    tenure: Tenure,
    successor: Option<Successor>,
    refusals: &[Rejection],
) -> TenureReview {
    let clock_offset = offset_bounds(&tenure);
    let believed_until_db = match (tenure.belief.until, clock_offset) {
        (Some(until), Some(offset)) => {
            // The lower bound was measured at the acquisition: allow for drift over the belief's length.
            let span_us = tenure
                .belief
                .from
                .map(|from| (until - from).num_microseconds().unwrap_or(i64::MAX).max(0))
                .unwrap_or(0);
            let drift_us = span_us.saturating_mul(CLOCK_DRIFT_PPM) / 1_000_000;
            Some(Interval {
                earliest: offset
                    .min_us
                    .map(|min| until + chrono::Duration::microseconds(min - drift_us)),
                latest: until + chrono::Duration::microseconds(offset.max_us),
            })
        }
        _ => None,
    };
    let (overlap, accepted_after_successor, refusals_after_successor) = match &successor {
        None => (Overlap::NoSuccessor, None, Vec::new()),
        Some(next) => {
            let later: Vec<Rejection> = refusals
                .iter()
                .filter(|r| {
                    r.presented_epoch == tenure.epoch.get()
                        && r.last_rejected_at >= next.acquired_at
                })
                .cloned()
                .collect();
            let accepted = [tenure.last_event_at, tenure.last_mark_at]
                .into_iter()
                .flatten()
                .filter(|at| *at >= next.acquired_at)
                .max();
            let refused_write_at = later.iter().map(|r| r.last_rejected_at).max();
            let overlap = match (refused_write_at, believed_until_db) {
                (Some(at), _) => Overlap::Certain {
                    refused_write_at: Some(at),
                },
                (None, Some(end)) if end.earliest.is_some_and(|e| e > next.acquired_at) => {
                    Overlap::Certain {
                        refused_write_at: None,
                    }
                }
                (None, Some(end)) if end.latest > next.acquired_at => Overlap::Possible,
                (None, Some(_)) => Overlap::None,
                (None, None) => Overlap::Unknown,
            };
            (overlap, accepted, later)
        }
    };
    TenureReview {
        tenure,
        successor,
        clock_offset,
        believed_until_db,
        overlap,
        accepted_after_successor,
        refusals_after_successor,
    }
}

/// (database − holder) clock bounds from a tenure's reports; `None` without a report or when they contradict
/// each other.
fn offset_bounds(tenure: &Tenure) -> Option<OffsetBounds> {
    let b = &tenure.belief;
    let us = |d: chrono::Duration| d.num_microseconds().unwrap_or(i64::MAX);
    let max_us = [
        b.start_received_at.zip(b.start_sent_at),
        b.end_received_at.zip(b.end_sent_at),
    ]
    .into_iter()
    .flatten()
    .map(|(received, sent)| us(received - sent))
    .min()?;
    let min_us = b.from.map(|from| us(tenure.acquired_at - from));
    if min_us.is_some_and(|min| min > max_us) {
        return None;
    }
    Some(OffsetBounds { min_us, max_us })
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Duration as D, Utc};

    use super::*;
    use crate::history::{Belief, ServerView};
    use crate::types::Epoch;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    /// A tenure acquired at `t0` (database clock) by a holder whose clock reads `skew` ahead of the database's,
    /// with 1 ms each way between them, that believed until `until_db` (database time) and reported it.
    fn tenure(epoch: i64, skew: D, until_db: Option<DateTime<Utc>>) -> Tenure {
        let one_way = D::milliseconds(1);
        let acquired_at = t0();
        let from = acquired_at + one_way + skew;
        Tenure {
            lease: "c/l".into(),
            epoch: Epoch::new(epoch).unwrap(),
            holder: format!("h{epoch}"),
            acquired_at,
            ended_at: None,
            end_reason: None,
            last_write_at: None,
            last_event_at: None,
            last_mark_at: None,
            server: ServerView::default(),
            belief: Belief {
                endpoint: Some("db:5432/x".into()),
                from: Some(from),
                start_sent_at: Some(from),
                start_received_at: Some(from - skew + one_way),
                until: until_db.map(|u| u + skew),
                end_cause: until_db.map(|_| "deadline".into()),
                end_detail: None,
                end_sent_at: until_db.map(|u| u + skew),
                end_received_at: until_db.map(|u| u + one_way),
            },
        }
    }

    fn successor_at(at: DateTime<Utc>) -> Tenure {
        let mut next = tenure(2, D::zero(), None);
        next.acquired_at = at;
        next
    }

    fn refusal(epoch: i64, at: DateTime<Utc>) -> Rejection {
        serde_json::from_value(serde_json::json!({
            "id": 1, "role": "app", "scope": "tenure", "lease": "c/l", "last_lease": null,
            "presented_epoch": epoch, "current_epoch": 2, "current_holder": "h2", "reason": "superseded",
            "operation": "fenced_transaction", "target_table": null, "target_key": null,
            "rejected_at": at, "last_rejected_at": at, "count": 1, "last_target_key": null,
            "application_name": "x", "client_addr": null, "backend_pid": 1
        }))
        .unwrap()
    }

    fn overlap_of(first: Tenure, successor: DateTime<Utc>, refusals: &[Rejection]) -> TenureReview {
        review(vec![first, successor_at(successor)], refusals).remove(0)
    }

    /// The verdicts by where the belief's end lies, with the two clocks an hour apart: a naive comparison of the
    /// holder's clock with the database's would call every one of these an overlap.
    #[test]
    fn beliefs_are_placed_on_the_database_time_line_through_the_offset_bounds() {
        let skew = D::hours(1);
        let a = t0() + D::seconds(10);
        let before = overlap_of(tenure(1, skew, Some(a - D::milliseconds(100))), a, &[]);
        assert_eq!(before.overlap, Overlap::None);
        let after = overlap_of(tenure(1, skew, Some(a + D::milliseconds(100))), a, &[]);
        assert_eq!(
            after.overlap,
            Overlap::Certain {
                refused_write_at: None
            }
        );
        // Within the ±1 ms the round trips leave open: either could be true.
        let close = overlap_of(tenure(1, skew, Some(a + D::microseconds(500))), a, &[]);
        assert_eq!(close.overlap, Overlap::Possible);
        let bounds = after.clock_offset.unwrap();
        assert!(bounds.min_us.unwrap() <= -3_600_000_000 && -3_600_000_000 <= bounds.max_us);
        // The end is bracketed around its true database time.
        let end = after.believed_until_db.unwrap();
        let truth = a + D::milliseconds(100);
        assert!(end.earliest.unwrap() <= truth && truth <= end.latest);
    }

    /// No end report: unknown, never invented — unless a refused write after the successor's acquisition proves
    /// the belief by the database's clock alone.
    #[test]
    fn a_missing_end_is_unknown_unless_a_refusal_proves_the_overlap() {
        let a = t0() + D::seconds(10);
        let silent = overlap_of(tenure(1, D::zero(), None), a, &[]);
        assert_eq!(silent.overlap, Overlap::Unknown);
        assert_eq!(silent.believed_until_db, None);
        let refused_at = a + D::seconds(3);
        let proved = overlap_of(
            tenure(1, D::zero(), None),
            a,
            &[
                refusal(1, refused_at),
                refusal(1, a - D::seconds(1)),
                refusal(2, a + D::seconds(5)),
            ],
        );
        assert_eq!(
            proved.overlap,
            Overlap::Certain {
                refused_write_at: Some(refused_at)
            }
        );
        assert_eq!(
            proved.refusals_after_successor.len(),
            1,
            "only this epoch's, after the acquisition"
        );
    }

    /// Reports that contradict each other (the holder's clock was stepped between them) give no offset, and
    /// a long belief widens the earliest placement by the allowed drift.
    #[test]
    fn contradicting_reports_give_no_offset_and_long_beliefs_allow_for_drift() {
        let a = t0() + D::seconds(10);
        let mut stepped = tenure(1, D::zero(), Some(a + D::seconds(1)));
        stepped.belief.end_sent_at = stepped.belief.end_sent_at.map(|t| t + D::seconds(30));
        let review = overlap_of(stepped, a, &[]);
        assert_eq!(review.clock_offset, None);
        assert_eq!(review.overlap, Overlap::Unknown);

        let long = D::seconds(10_000);
        let r = overlap_of(
            tenure(1, D::zero(), Some(t0() + long)),
            t0() + long + D::seconds(5),
            &[],
        );
        let end = r.believed_until_db.unwrap();
        let drift = end.latest - end.earliest.unwrap();
        assert!(drift >= D::seconds(2), "200 ppm of 10,000 s: {drift}");
        assert_eq!(r.overlap, Overlap::None);
    }

    /// A write of the epoch accepted at or after the successor's acquisition is reported (a broken fence);
    /// one before it is not; the last tenure has no successor.
    #[test]
    fn writes_accepted_after_the_successor_are_reported() {
        let a = t0() + D::seconds(10);
        let mut broken = tenure(1, D::zero(), None);
        broken.last_mark_at = Some(a + D::milliseconds(3));
        assert_eq!(
            overlap_of(broken, a, &[]).accepted_after_successor,
            Some(a + D::milliseconds(3))
        );
        let mut fine = tenure(1, D::zero(), None);
        fine.last_event_at = Some(a - D::milliseconds(3));
        assert_eq!(overlap_of(fine, a, &[]).accepted_after_successor, None);
        let last = review(vec![tenure(1, D::zero(), None)], &[]).remove(0);
        assert_eq!(last.overlap, Overlap::NoSuccessor);
    }
}
