//! The tasks of a lease and their events ([`Store::tasks`], [`Tasks`]), built on the guard: every write is one
//! statement (`SELECT * FROM pgfence.<op>(…)`, prepared once per connection and reused) that checks the fence,
//! writes the task row (raising its row fence to the presented epoch) and appends the task's event, atomically.
//!
//! SQL: `migrations/2026-11-30-000004_tasks/up.sql` (`pgfence.create_task`, `pgfence.claim_task`,
//! `pgfence.transition_task`, `pgfence.append_event`).

use chrono::{DateTime, Utc};
use diesel::pg::sql_types::Jsonb;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fence::{
    outcome::sql::WriteResult, outcome::WriteOutcome, outcome::WriteResultRow, Fence,
};
use crate::limits::{MAX_KIND_LEN, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH};
use crate::reply::{unexpected, RowsOf};
use crate::store::Store;
use crate::types::Epoch;
pub use crate::types::TaskState;
use crate::validate::{validate_holder, validate_name};

/// The tasks of a [`Store`] ([`Store::tasks`]): guarded writes under a lease's fence, each appending the task's
/// event, and the reads of a task and its history.
#[derive(Debug, Clone, Copy)]
pub struct Tasks<'a> {
    store: &'a Store,
}

impl Store {
    /// The tasks and their events: created, claimed, moved on and appended to under a fence, and read (see
    /// [`Tasks`]).
    pub fn tasks(&self) -> Tasks<'_> {
        Tasks { store: self }
    }
}

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Task {
    /// Database id.
    pub id: i64,
    /// The cluster-qualified lease that owns it.
    pub lease: String,
    /// Its stable key, unique per lease.
    pub key: String,
    /// Its state.
    pub state: TaskState,
    /// Who claimed it.
    pub assignee: Option<String>,
    /// The payload given at creation (a serde_json 1 value, re-exported as
    /// [`pgfence::reexports::serde_json`](crate::reexports::serde_json)).
    pub payload: serde_json::Value,
    /// The highest epoch that wrote the row; writes presenting a lower epoch are refused.
    pub fence: Epoch,
    /// Incremented by every state change.
    pub version: i64,
}

/// The result of a guarded task write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskWrite {
    /// The task after the write.
    pub task: Task,
    /// For `create_task`: whether this call created it (false: a retry found it).
    pub created: bool,
    /// The event the write appended (`None` for a `create_task` retry, which appends nothing).
    pub event_id: Option<i64>,
}

/// One row of `pgfence.task_events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, QueryableByName)]
#[non_exhaustive]
pub struct TaskEvent {
    /// Event id, increasing in commit-insertion order.
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// The task.
    #[diesel(sql_type = BigInt)]
    pub task_id: i64,
    /// The epoch that wrote it.
    #[diesel(sql_type = BigInt)]
    pub epoch: i64,
    /// `created`, `claimed`, a state name, or the caller's kind for appended events.
    #[diesel(sql_type = Text)]
    pub kind: String,
    /// The event's payload (a serde_json 1 value, re-exported as
    /// [`pgfence::reexports::serde_json`](crate::reexports::serde_json)).
    #[diesel(sql_type = Jsonb)]
    pub payload: serde_json::Value,
    /// When it was written (database clock, UTC).
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
}

/// The task functions, each called as `SELECT * FROM pgfence.f(…)` ([`RowsOf`]) and answered by one
/// [`WriteResultRow`].
mod sql {
    use super::*;

    diesel::define_sql_function! {
        #[sql_name = "pgfence.create_task"]
        fn create_task(lease: Text, epoch: BigInt, secret: Text, key: Text, payload: Jsonb) -> WriteResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.claim_task"]
        fn claim_task(lease: Text, epoch: BigInt, secret: Text, key: Text, assignee: Text) -> WriteResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.transition_task"]
        fn transition_task(lease: Text, epoch: BigInt, secret: Text, key: Text, from: Text, to: Text, payload: Jsonb)
            -> WriteResult;
    }
    diesel::define_sql_function! {
        #[sql_name = "pgfence.append_event"]
        fn append_event(lease: Text, epoch: BigInt, secret: Text, key: Text, kind: Text, payload: Jsonb) -> WriteResult;
    }
}

fn validate_key(key: &str) -> Result<()> {
    validate_holder("task key", key)
}

/// Refuses payloads PostgreSQL would reject (a `\u0000` in a string) or that are too large or deep, before
/// anything is sent.
pub(crate) fn validate_payload(payload: &serde_json::Value) -> Result<()> {
    fn walk(value: &serde_json::Value, depth: usize) -> Result<()> {
        if depth > MAX_PAYLOAD_DEPTH {
            return Err(Error::invalid(
                "payload",
                format!("nested deeper than {MAX_PAYLOAD_DEPTH} levels"),
            ));
        }
        match value {
            serde_json::Value::String(s) if s.contains('\0') => Err(Error::invalid(
                "payload",
                "strings must not contain NUL (\\u0000)",
            )),
            serde_json::Value::Array(items) => items.iter().try_for_each(|v| walk(v, depth + 1)),
            serde_json::Value::Object(map) => map.iter().try_for_each(|(k, v)| {
                if k.contains('\0') {
                    return Err(Error::invalid(
                        "payload",
                        "keys must not contain NUL (\\u0000)",
                    ));
                }
                walk(v, depth + 1)
            }),
            _ => Ok(()),
        }
    }
    walk(payload, 0)?;
    // Count the serialized bytes without building the text: the driver serializes the payload again to send it.
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let size = serde_json::to_writer(&mut counter, payload).map_or(usize::MAX, |()| counter.0);
    if size > MAX_PAYLOAD_BYTES {
        return Err(Error::invalid(
            "payload",
            format!("{size} bytes serialized, at most {MAX_PAYLOAD_BYTES} allowed"),
        ));
    }
    Ok(())
}

impl Tasks<'_> {
    async fn guarded_task_write<Q>(
        &self,
        fence: &Fence,
        operation: &str,
        key: &str,
        expected: Option<TaskState>,
        query: impl Fn() -> Q,
    ) -> Result<TaskWrite>
    where
        Q: diesel_async::methods::LoadQuery<
                'static,
                diesel_async::AsyncPgConnection,
                WriteResultRow,
            > + Send
            + 'static,
    {
        // The query is built again only for the rare retry (a session default other than READ COMMITTED), so the
        // common path copies the payload once.
        let row: WriteResultRow = self.store.call_guarded(query).await?;
        match row.outcome(operation)? {
            WriteOutcome::Ok => task_write(operation, fence, row),
            WriteOutcome::NotFound => Err(Error::TaskNotFound {
                lease: fence.lease().to_owned(),
                key: key.to_owned(),
            }),
            WriteOutcome::InDoubt { effect_key, epoch } => Err(Error::InDoubt {
                lease: fence.lease().to_owned(),
                task_key: key.to_owned(),
                effect_key,
                epoch,
            }),
            WriteOutcome::Conflict { actual } => Err(Error::Conflict {
                lease: fence.lease().to_owned(),
                key: key.to_owned(),
                expected: expected.unwrap_or(TaskState::Pending),
                actual,
            }),
            refused => Err(refused.into_error(fence, operation, operation)),
        }
    }

    /// Creates a pending task with stable `key` under the fence's lease, together with its `created` event.
    /// Idempotent by key: a retry (for instance after a connection died before the reply) returns the same
    /// task with `created == false` and appends no second event.
    ///
    /// `payload` is a serde_json 1 [`Value`](serde_json::Value) (re-exported as
    /// [`pgfence::reexports::serde_json`](crate::reexports::serde_json)), at most [`MAX_PAYLOAD_BYTES`]
    /// serialized and [`MAX_PAYLOAD_DEPTH`] deep, without NUL characters.
    ///
    /// ```no_run
    /// # async fn example(store: pgfence::Store, lease: pgfence::Lease) -> pgfence::Result<()> {
    /// let write = store
    ///     .tasks().create(&lease.fence(), "deploy-42", &serde_json::json!({"image": "api:1.7"}))
    ///     .await?;
    /// assert_eq!(write.task.state, pgfence::tasks::TaskState::Pending);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited; nothing else written).
    /// - [`Error::InvalidInput`] for a malformed `key` or a refused payload; nothing was sent.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may have created the task; calling again is safe (idempotent by key). See
    /// [cancel safety](crate#cancel-safety).
    #[tracing::instrument(name = "create_task", level = "debug", skip_all, fields(lease = fence.lease(), epoch = fence.epoch().get(), key = key))]
    pub async fn create(
        &self,
        fence: &Fence,
        key: &str,
        payload: &serde_json::Value,
    ) -> Result<TaskWrite> {
        validate_key(key)?;
        validate_payload(payload)?;
        let query = || {
            RowsOf(sql::create_task(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                key.to_owned(),
                payload.clone(),
            ))
        };
        self.guarded_task_write(fence, "create_task", key, None, query)
            .await
    }

    /// Claims a pending task for `assignee`: the pending check, the row fence and the `claimed` event in one
    /// atomic step.
    ///
    /// # Errors
    ///
    /// - [`Error::Conflict`] when the task is not pending (a business outcome, not audited).
    /// - [`Error::InDoubt`] when the task has an effect in doubt (an ended tenure's intent without an outcome, or
    ///   an unknown outcome): settle it first ([`Effects::settle`](crate::effects::Effects::settle)).
    /// - [`Error::TaskNotFound`] when the lease has no task `key`.
    /// - [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited; nothing else written).
    /// - [`Error::InvalidInput`] for a malformed `key` or `assignee`; nothing was sent.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped claim may have committed: retried, it then answers [`Error::Conflict`] (read the task to see
    /// who holds it). See [cancel safety](crate#cancel-safety).
    #[tracing::instrument(name = "claim_task", level = "debug", skip_all, fields(lease = fence.lease(), epoch = fence.epoch().get(), key = key))]
    pub async fn claim(&self, fence: &Fence, key: &str, assignee: &str) -> Result<TaskWrite> {
        validate_key(key)?;
        validate_holder("assignee", assignee)?;
        let query = || {
            RowsOf(sql::claim_task(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                key.to_owned(),
                assignee.to_owned(),
            ))
        };
        self.guarded_task_write(fence, "claim_task", key, Some(TaskState::Pending), query)
            .await
    }

    /// Moves a task from `from` to `to` and appends an event of kind `to` carrying `payload`.
    ///
    /// `payload` is a serde_json 1 [`Value`](serde_json::Value) (re-exported as
    /// [`pgfence::reexports::serde_json`](crate::reexports::serde_json)), at most [`MAX_PAYLOAD_BYTES`]
    /// serialized and [`MAX_PAYLOAD_DEPTH`] deep, without NUL characters.
    ///
    /// # Errors
    ///
    /// - [`Error::Conflict`] when the task is not in `from`.
    /// - [`Error::InDoubt`] when the task has an effect in doubt (an ended tenure's intent without an outcome, or
    ///   an unknown outcome): settle it first ([`Effects::settle`](crate::effects::Effects::settle)).
    /// - [`Error::TaskNotFound`] when the lease has no task `key`.
    /// - [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited; nothing else written).
    /// - [`Error::InvalidInput`] for a malformed `key` or a refused payload; nothing was sent.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A dropped transition may have committed: retried, it then answers [`Error::Conflict`] (the task is in
    /// `to` already). See [cancel safety](crate#cancel-safety).
    #[tracing::instrument(name = "transition_task", level = "debug", skip_all, fields(lease = fence.lease(), epoch = fence.epoch().get(), key = key))]
    pub async fn transition(
        &self,
        fence: &Fence,
        key: &str,
        from: TaskState,
        to: TaskState,
        payload: &serde_json::Value,
    ) -> Result<TaskWrite> {
        validate_key(key)?;
        validate_payload(payload)?;
        let query = || {
            RowsOf(sql::transition_task(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                key.to_owned(),
                from.as_str().to_owned(),
                to.as_str().to_owned(),
                payload.clone(),
            ))
        };
        self.guarded_task_write(fence, "transition_task", key, Some(from), query)
            .await
    }

    /// Appends an event of `kind` to a task (and raises the task's row fence to this epoch).
    ///
    /// `payload` is a serde_json 1 [`Value`](serde_json::Value) (re-exported as
    /// [`pgfence::reexports::serde_json`](crate::reexports::serde_json)), at most [`MAX_PAYLOAD_BYTES`]
    /// serialized and [`MAX_PAYLOAD_DEPTH`] deep, without NUL characters.
    ///
    /// # Errors
    ///
    /// - [`Error::TaskNotFound`] when the lease has no task `key`.
    /// - [`Error::Stale`] or [`Error::Denied`] when the fence is refused (audited; nothing else written).
    /// - [`Error::InvalidInput`] for a malformed `key` or `kind` (at most [`MAX_KIND_LEN`] characters) or a
    ///   refused payload; nothing was sent.
    /// - The [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// Not idempotent: a dropped call may have appended its event, and calling again appends a second one
    /// (read [`events`](Self::events) first). See [cancel safety](crate#cancel-safety).
    #[tracing::instrument(level = "debug", skip_all, fields(lease = fence.lease(), epoch = fence.epoch().get(), key = key))]
    pub async fn append_event(
        &self,
        fence: &Fence,
        key: &str,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<TaskWrite> {
        validate_key(key)?;
        validate_payload(payload)?;
        crate::validate::check_text("event kind", kind, MAX_KIND_LEN)?;
        let query = || {
            RowsOf(sql::append_event(
                fence.lease().to_owned(),
                fence.epoch().get(),
                fence.secret().expose_secret().to_owned(),
                key.to_owned(),
                kind.to_owned(),
                payload.clone(),
            ))
        };
        self.guarded_task_write(fence, "append_event", key, None, query)
            .await
    }

    /// Reads a task of lease `name` (this store's cluster) by key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed `name` or `key`, and the
    /// [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn get(&self, name: &str, key: &str) -> Result<Option<Task>> {
        use diesel::OptionalExtension;
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        validate_key(key)?;
        let mut conn = self.store.conn().await?;
        let row: Option<TaskRow> = diesel::sql_query(
            "SELECT id, lease, key, state, assignee, payload, fence, version FROM pgfence.tasks \
              WHERE lease = $1 AND key = $2",
        )
        .bind::<Text, _>(self.store.qualify(name))
        .bind::<Text, _>(key)
        .get_result(&mut *conn)
        .await
        .optional()?;
        row.map(Task::try_from).transpose()
    }

    /// Every event of a task, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed `name` or `key`, and the
    /// [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn events(&self, name: &str, key: &str) -> Result<Vec<TaskEvent>> {
        use diesel_async::RunQueryDsl;
        validate_name(name)?;
        validate_key(key)?;
        let mut conn = self.store.conn().await?;
        let rows = diesel::sql_query(
            "SELECT e.id, e.task_id, e.epoch, e.kind, e.payload, e.created_at \
               FROM pgfence.task_events e JOIN pgfence.tasks t ON t.id = e.task_id \
              WHERE t.lease = $1 AND t.key = $2 ORDER BY e.id",
        )
        .bind::<Text, _>(self.store.qualify(name))
        .bind::<Text, _>(key)
        .load(&mut *conn)
        .await?;
        Ok(rows)
    }
}

#[derive(QueryableByName)]
struct TaskRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    lease: String,
    #[diesel(sql_type = Text)]
    key: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Nullable<Text>)]
    assignee: Option<String>,
    #[diesel(sql_type = Jsonb)]
    payload: serde_json::Value,
    #[diesel(sql_type = BigInt)]
    fence: i64,
    #[diesel(sql_type = BigInt)]
    version: i64,
}

impl TryFrom<TaskRow> for Task {
    type Error = Error;
    fn try_from(row: TaskRow) -> Result<Task> {
        Ok(Task {
            id: row.id,
            lease: row.lease,
            key: row.key,
            state: row.state.parse()?,
            assignee: row.assignee,
            payload: row.payload,
            fence: Epoch::new(row.fence)?,
            version: row.version,
        })
    }
}

/// The task an `ok` of `pgfence.<function>` carries.
fn task_write(function: &str, fence: &Fence, row: WriteResultRow) -> Result<TaskWrite> {
    let missing = |what: &str| unexpected(function, &format!("ok without {what}"));
    let state = row.task_state.ok_or_else(|| missing("task state"))?;
    let task = Task {
        id: row.task_id.ok_or_else(|| missing("task id"))?,
        lease: fence.lease().to_owned(),
        key: row.task_key.ok_or_else(|| missing("task key"))?,
        state: state
            .parse()
            .map_err(|_| unexpected(function, &format!("task state {state}")))?,
        assignee: row.assignee,
        payload: row.payload.unwrap_or(serde_json::Value::Null),
        fence: Epoch::from_db(row.fence).ok_or_else(|| missing("fence"))?,
        version: row.version.unwrap_or(1),
    };
    Ok(TaskWrite {
        task,
        created: row.created.unwrap_or(false),
        event_id: row.event_id,
    })
}
