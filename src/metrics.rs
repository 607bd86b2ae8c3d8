//! The metrics pgfence records, through the [`metrics`](https://docs.rs/metrics) facade: their names, and
//! [`describe`], which tells the installed recorder their units and help texts.

/// Gauge `pgfence_leader{lease}`: 1 while this process holds a tenure of the lease, 0 once it ended.
pub const METRIC_LEADER: &str = "pgfence_leader";
/// Counter `pgfence_leader_transitions_total{lease}`: tenures of the lease this process began or ended (each
/// tenure counts twice: once when acquired, once when lost or released).
pub const METRIC_TRANSITIONS: &str = "pgfence_leader_transitions_total";
/// Counter `pgfence_lease_losses_total{lease,cause}`: tenures this process lost, by `cause`: `definitive` (the
/// database ended it), `deadline` (no renewal before the local deadline) or `injected` (a test double).
pub const METRIC_LOSSES: &str = "pgfence_lease_losses_total";
/// Histogram `pgfence_renew_duration_seconds`: the round trip of one renewal statement of a
/// [`PgElector`](crate::leader::PgElector), in seconds (one observation per statement, however many leases it
/// renewed).
pub const METRIC_RENEW_DURATION: &str = "pgfence_renew_duration_seconds";
/// Counter `pgfence_callbacks_not_stopped_total{lease}`: leader callbacks that did not return within the grace
/// period after their tenure ended, and were aborted.
pub const METRIC_CALLBACKS_NOT_STOPPED: &str = "pgfence_callbacks_not_stopped_total";
/// Counter `pgfence_stale_writes_total{lease}`: writes of this process the database refused as stale (and
/// audited).
pub const METRIC_STALE_WRITES: &str = "pgfence_stale_writes_total";
/// Gauge `pgfence_group_members{group}`: the live members of the group at this replica's last roster read.
pub const METRIC_GROUP_MEMBERS: &str = "pgfence_group_members";
/// Gauge `pgfence_group_names_assigned{group}`: the names the group's assignment gives this replica (what it
/// should lead).
pub const METRIC_GROUP_NAMES_ASSIGNED: &str = "pgfence_group_names_assigned";
/// Gauge `pgfence_group_names_led{group}`: the names of the group this replica leads now.
pub const METRIC_GROUP_NAMES_LED: &str = "pgfence_group_names_led";
/// Counter `pgfence_handovers_total{group}`: tenures this replica ended to hand their name over.
pub const METRIC_HANDOVERS: &str = "pgfence_handovers_total";
/// Histogram `pgfence_handover_gap_duration_seconds{group}`: how long a name this replica acquired after a
/// handover had no holder (the predecessor's release to this acquisition, database clock).
pub const METRIC_HANDOVER_GAP: &str = "pgfence_handover_gap_duration_seconds";
/// Histogram `pgfence_group_assigned_to_led_seconds{group}`: how long after a name arrived in this replica's
/// assignment the replica's first tenure of it began (monotonic clock): the convergence as each name lived it,
/// its queue for a turn and its wait for the previous holder's release included.
pub const METRIC_GROUP_ASSIGNED_TO_LED: &str = "pgfence_group_assigned_to_led_seconds";
/// Counter `pgfence_group_rebalances_total{group}`: assignments of the group this replica computed and stored
/// (a fleet stores one per change, whichever member gets the claim).
pub const METRIC_GROUP_REBALANCES: &str = "pgfence_group_rebalances_total";
/// Histogram `pgfence_acquisition_turn_wait_seconds`: how long an acquisition attempt of the leadership runtime
/// waited for its turn ([`Elector::acquisition_turn`](crate::leader::Elector::acquisition_turn)): the queue of a
/// replica's names campaigning at once.
pub const METRIC_ACQUISITION_TURN_WAIT: &str = "pgfence_acquisition_turn_wait_seconds";
/// Counter `pgfence_belief_reports_failed_total{lease}`: belief reports of a
/// [`PgElector`](crate::leader::PgElector)
/// ([`LeaseOptions::report_beliefs`](crate::leader::LeaseOptions::report_beliefs)) that failed or timed out; the
/// review then shows that belief as unknown.
pub const METRIC_BELIEF_REPORTS_FAILED: &str = "pgfence_belief_reports_failed_total";
/// Gauge `pgfence_effects_in_doubt{lease}`: the effects of the lease in doubt at the last
/// [`Effects::in_doubt`](crate::effects::Effects::in_doubt) listing of this process.
pub const METRIC_EFFECTS_IN_DOUBT: &str = "pgfence_effects_in_doubt";
/// Histogram `pgfence_effect_settle_seconds{lease, resolution}`: how long each effect this process settled had
/// been in doubt — from the end of the tenure that left it (or its `unknown` outcome) to the settle, by the
/// database clock.
pub const METRIC_EFFECT_SETTLE_SECONDS: &str = "pgfence_effect_settle_seconds";

/// Describes every metric pgfence records — its unit and help text — to the `metrics` recorder installed now
/// (an exporter shows them, e.g. as Prometheus `# HELP` lines). Call it once after installing the recorder:
/// pgfence does not call it itself, because a description sent before the application installs its recorder
/// is lost. Calling it again is harmless.
///
/// | metric | type | unit | labels | what |
/// |---|---|---|---|---|
/// | `pgfence_leader` ([`METRIC_LEADER`]) | gauge | count | `lease` | 1 while this process holds a tenure of the lease, else 0 |
/// | `pgfence_leader_transitions_total` ([`METRIC_TRANSITIONS`]) | counter | count | `lease` | tenures this process began or ended |
/// | `pgfence_lease_losses_total` ([`METRIC_LOSSES`]) | counter | count | `lease`, `cause` | tenures lost: `definitive`, `deadline`, `injected` |
/// | `pgfence_renew_duration_seconds` ([`METRIC_RENEW_DURATION`]) | histogram | seconds | — | round trip of one batched renewal statement |
/// | `pgfence_callbacks_not_stopped_total` ([`METRIC_CALLBACKS_NOT_STOPPED`]) | counter | count | `lease` | leader callbacks aborted after the grace period |
/// | `pgfence_stale_writes_total` ([`METRIC_STALE_WRITES`]) | counter | count | `lease` | writes refused as stale (and audited) |
/// | `pgfence_group_members` ([`METRIC_GROUP_MEMBERS`]) | gauge | count | `group` | live members of the group at this replica's last roster read |
/// | `pgfence_group_names_assigned` ([`METRIC_GROUP_NAMES_ASSIGNED`]) | gauge | count | `group` | names the group's assignment gives this replica |
/// | `pgfence_group_names_led` ([`METRIC_GROUP_NAMES_LED`]) | gauge | count | `group` | names of the group this replica leads now |
/// | `pgfence_handovers_total` ([`METRIC_HANDOVERS`]) | counter | count | `group` | tenures this replica ended to hand their name over |
/// | `pgfence_handover_gap_duration_seconds` ([`METRIC_HANDOVER_GAP`]) | histogram | seconds | `group` | how long a name acquired after a handover had no holder (database clock) |
/// | `pgfence_group_assigned_to_led_seconds` ([`METRIC_GROUP_ASSIGNED_TO_LED`]) | histogram | seconds | `group` | from a name's arrival in this replica's assignment to its first tenure |
/// | `pgfence_group_rebalances_total` ([`METRIC_GROUP_REBALANCES`]) | counter | count | `group` | assignments of the group this replica computed and stored |
/// | `pgfence_acquisition_turn_wait_seconds` ([`METRIC_ACQUISITION_TURN_WAIT`]) | histogram | seconds | — | an acquisition attempt's wait for its turn |
/// | `pgfence_belief_reports_failed_total` ([`METRIC_BELIEF_REPORTS_FAILED`]) | counter | count | `lease` | belief reports that failed or timed out |
/// | `pgfence_effects_in_doubt` ([`METRIC_EFFECTS_IN_DOUBT`]) | gauge | count | `lease` | effects of the lease in doubt at this process's last listing |
/// | `pgfence_effect_settle_seconds` ([`METRIC_EFFECT_SETTLE_SECONDS`]) | histogram | seconds | `lease`, `resolution` | how long each effect this process settled had been in doubt (database clock) |
///
/// ```
/// // After installing the application's exporter (metrics-exporter-prometheus, …):
/// pgfence::metrics::describe();
/// ```
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        METRIC_LEADER,
        Unit::Count,
        "1 while this process holds a tenure of the lease, else 0"
    );
    describe_counter!(
        METRIC_TRANSITIONS,
        Unit::Count,
        "Tenures of the lease this process began or ended (acquired, lost or released)"
    );
    describe_counter!(
        METRIC_LOSSES,
        Unit::Count,
        "Tenures this process lost, by cause: definitive (the database ended it), deadline (no renewal before \
         the local deadline), injected (test double)"
    );
    describe_histogram!(
        METRIC_RENEW_DURATION,
        Unit::Seconds,
        "Round trip of one batched renewal statement (one observation per statement, however many leases)"
    );
    describe_counter!(
        METRIC_CALLBACKS_NOT_STOPPED,
        Unit::Count,
        "Leader callbacks that did not return within the grace period after their tenure ended, and were aborted"
    );
    describe_gauge!(
        METRIC_GROUP_MEMBERS,
        Unit::Count,
        "Live members of the replica group at this replica's last roster read"
    );
    describe_gauge!(
        METRIC_GROUP_NAMES_ASSIGNED,
        Unit::Count,
        "Names the group's balanced assignment gives this replica (what it should lead)"
    );
    describe_gauge!(
        METRIC_GROUP_NAMES_LED,
        Unit::Count,
        "Names of the replica group this replica leads now"
    );
    describe_counter!(
        METRIC_HANDOVERS,
        Unit::Count,
        "Tenures this replica ended to hand their name over to the member the assignment gives it to"
    );
    describe_histogram!(
        METRIC_HANDOVER_GAP,
        Unit::Seconds,
        "How long a name this replica acquired after a handover had no holder (predecessor's release to this \
         acquisition, database clock)"
    );
    describe_histogram!(
        METRIC_GROUP_ASSIGNED_TO_LED,
        Unit::Seconds,
        "How long after a name arrived in this replica's assignment its first tenure began (monotonic clock)"
    );
    describe_counter!(
        METRIC_GROUP_REBALANCES,
        Unit::Count,
        "Assignments of the replica group this replica computed and stored"
    );
    describe_histogram!(
        METRIC_ACQUISITION_TURN_WAIT,
        Unit::Seconds,
        "How long an acquisition attempt of the leadership runtime waited for its turn (the queue of a \
         replica's names campaigning at once)"
    );
    describe_counter!(
        METRIC_STALE_WRITES,
        Unit::Count,
        "Writes of this process the database refused as stale (each also a row in pgfence.rejections)"
    );
    describe_counter!(
        METRIC_BELIEF_REPORTS_FAILED,
        Unit::Count,
        "Reports of when this process started or stopped believing it led a tenure that failed or timed out \
         (the overlap review shows such a belief as unknown)"
    );
    describe_gauge!(
        METRIC_EFFECTS_IN_DOUBT,
        Unit::Count,
        "Effects of the lease in doubt (an ended tenure's intent without an outcome, or an unknown outcome) at \
         this process's last listing"
    );
    describe_histogram!(
        METRIC_EFFECT_SETTLE_SECONDS,
        Unit::Seconds,
        "How long each effect this process settled had been in doubt: from the end of the tenure that left it \
         (or its unknown outcome) to the settle, database clock"
    );
}
