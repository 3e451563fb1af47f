//! A user turn's opening, before its loop (`reasoner`): the begin step with retrieval beside
//! it, a stored result or refused contexts answered without a model call, and what the first
//! model call is made from.

use std::sync::Arc;

use tracing::{debug, info};

use super::Pipeline;
use super::backends;
use super::compose;
use super::lifecycle::{Begin, Run};
use super::model_call::CallInput;
use super::outcome::{Interrupted, Settled, TurnPrint, store_failure};
use crate::contract::UserTurn;
use crate::live::LiveTurn;
use crate::store::{ContextIds, TurnProgress, TurnRecord, now_rfc3339};

/// Where a user turn stands once its run is open: answered already, or ready to reason.
pub(super) enum Opened {
    /// Settled without a model call (a stored result, or contexts refused).
    Settled(Settled),
    /// The run and what its first model call is made from.
    Reason {
        run: Run,
        progress: TurnProgress,
        input: CallInput,
        previous: Option<String>,
    },
}

impl Pipeline {
    /// A user turn: its run opened (boxed: the begin step's answer, the records and the
    /// session it reads are large, and a turn waiting on its model should not carry them —
    /// `-Zprint-type-sizes` showed this future at 14.6 KB with them, 7.8 KB of it the loop),
    /// then the loop.
    pub(super) async fn run_user_turn(
        &self,
        print: TurnPrint<'_>,
        tenant: Option<&str>,
        live: Option<Arc<LiveTurn>>,
    ) -> Result<Settled, Interrupted> {
        // The opened run is taken apart in a statement of its own: a `match` on the opening's
        // answer would keep that answer (and the `?`'s copy of it) alive across the loop.
        let (run, progress, input, previous) =
            match super::boxed::boxed(|| self.open_user_turn(print, tenant, live)).await? {
                Opened::Settled(settled) => return Ok(settled),
                Opened::Reason {
                    run,
                    progress,
                    input,
                    previous,
                } => (run, progress, input, previous),
            };
        Ok(self.reason(run, progress, input, previous).await?)
    }

    pub(super) async fn open_user_turn(
        &self,
        print: TurnPrint<'_>,
        tenant: Option<&str>,
        live: Option<Arc<LiveTurn>>,
    ) -> Result<Opened, Interrupted> {
        let turn = print.turn();
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        // The contexts the turn asks for are checked before anything is stored: only known
        // ones are latched (in the begin step, for a new session).
        let asked = backends::asked_for(&self.contexts, turn);
        // Retrieval only reads: it goes out beside the begin step, one round trip for both
        // instead of two in a row (its chunks are dropped when the run does not start fresh).
        // For a tenant not known to have an index, the begin step looks whether it has one,
        // and the read follows only if so.
        let probe = self.retrieval_probe(sid);
        let (begun, chunks) = super::boxed::boxed(|| {
            self.begin_beside_retrieval(turn, asked.as_ref().ok(), probe.as_deref())
        })
        .await;
        let begun = begun?;
        // A turn that already ran (a duplicate or redelivered job) answers with its stored
        // result; another payload's turn is not this job's.
        if let Some(rec) = &begun.turn {
            let answer = match self.life.finished(rec, print) {
                Ok(None) => None,
                Ok(Some(done)) => Some(Ok(Settled::stored(done))),
                Err(not_the_turns) => Some(Err(not_the_turns)),
            };
            if let Some(answer) = answer {
                // Boxed: a rare path (a duplicate job) whose answer, held across the lease's
                // release, was the opening's largest state (2,824 bytes in every turn's).
                let held = begun.held;
                return Box::pin(async move {
                    if let Some(held) = held {
                        held.release().await;
                    }
                    answer.map(Opened::Settled)
                })
                .await;
            }
        }
        let Some(held) = begun.held else {
            return Err(super::lifecycle::busy(sid).into());
        };
        let (existing, loaded) = (begun.turn, begun.session);
        // Contexts the front door should have refused fail the turn, stored like any result.
        let found = (self.model.backends).contexts_of(asked, turn, loaded.as_ref(), begun.latched);
        let (resolved, contexts) = match found {
            Ok(Ok(found)) => found,
            Ok(Err(errors)) => {
                let record = existing.unwrap_or_else(|| {
                    Box::new(TurnRecord::queued(
                        sid.clone(),
                        tid.clone(),
                        print.value(),
                        String::new(),
                    ))
                });
                let session = loaded.unwrap_or_else(|| self.life.new_session(sid));
                let refused = backends::refused(errors);
                // Boxed: a rare path whose state (9 KB) every opening turn would carry.
                return Ok(Opened::Settled(
                    Box::pin(
                        self.life
                            .fail_at_start(held, record, session, live, refused, begun.runs),
                    )
                    .await?,
                ));
            }
            Err(e) => {
                held.release().await;
                return Err(store_failure(e).into());
            }
        };
        let boot = resolved.conversation.boot_prompt.clone();
        // The session is written at the start of the run only when it is new or the turn
        // changes it; otherwise the write that settles the turn is its next one.
        let new_session = loaded.is_none();
        let mut changed = new_session;
        let mut session = loaded.unwrap_or_else(|| self.life.new_session(sid));
        if session.contexts != contexts {
            session.contexts = contexts;
            changed = true;
        }
        if let Some(t) = tenant
            && session.owner.as_deref() != Some(t)
        {
            session.owner = Some(t.to_string());
            changed = true;
        }
        // A session whose stored mode id is no longer in the catalog continues in the default.
        let mode = self.catalog.by_id_or_default(&session.mode_id).clone();
        if session.mode_key != mode.key {
            session.mode_key = mode.key.clone();
            changed = true;
        }
        if let Some(ctx) = turn.solution_context_text()
            && session.solution_context.as_deref() != Some(ctx)
        {
            session.solution_context = Some(ctx.to_string());
            changed = true;
        }
        if changed {
            session.updated_at = now_rfc3339();
        }

        // A record this run creates (its front door's write was lost) says what the request
        // asked, streaming included.
        let stored = existing.is_some();
        let record = existing.unwrap_or_else(|| {
            Box::new(
                TurnRecord::queued(sid.clone(), tid.clone(), print.value(), mode.key.clone())
                    .with_streaming(turn.streaming()),
            )
        });
        let resuming = record.checkpoint.is_some();
        let start = super::lifecycle::Start {
            changed,
            new_session,
            stored,
            runs: begun.runs,
            stop_requested: begun.stop_requested,
        };
        let run = super::boxed::boxed(|| {
            self.life
                .start_user_turn(held, record, session, start, live)
        })
        .await?;
        // One line per turn at info is its end; a start is worth one only when it is a retry or
        // a resumption (a turn that runs again).
        let (attempt, resumed) = (run.record().attempts, resuming);
        if attempt > 1 || resumed {
            info!(mode = %mode.key, attempt, resumed, "turn started again");
        } else {
            debug!(mode = %mode.key, attempt, resumed, "turn started");
        }

        if resuming {
            // A crashed or retried run left a resume point: continue from it.
            let previous = None;
            return Ok(Opened::Reason {
                run,
                progress: TurnProgress::default(),
                input: CallInput::default(),
                previous,
            });
        }
        let first_call =
            run.session().previous_response_id.is_none() && run.session().conversation.is_empty();
        let input = CallInput {
            boot: first_call.then_some(boot),
            items: vec![compose::user_message(
                &run.session().mode_key,
                turn,
                run.session().solution_context.as_deref(),
                &chunks,
            )],
        };
        let progress = TurnProgress {
            tools_mode_key: mode.key.clone(),
            ..Default::default()
        };
        let previous = run.session().previous_response_id.clone();
        Ok(Opened::Reason {
            run,
            progress,
            input,
            previous,
        })
    }

    /// The begin step, and the retrieval beside it: at once when the tenant is known to have
    /// an index (`probe` is `None`), else after the begin step says whether it has one. Its
    /// own future (boxed by the caller), made of references: a begin step's future made
    /// before and captured would be held twice, as captured and as awaited.
    pub(super) async fn begin_beside_retrieval(
        &self,
        turn: &UserTurn,
        asked: Option<&ContextIds>,
        probe: Option<&str>,
    ) -> (Result<Begin, Interrupted>, Vec<compose::ContextChunk>) {
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        if probe.is_none() {
            return tokio::join!(
                self.life.begin(sid, tid, asked, probe),
                self.context_chunks(sid, turn)
            );
        }
        let begun = self.life.begin(sid, tid, asked, probe).await;
        let chunks = match &begun {
            Ok(b) if b.held.is_some() && b.probed != Some(false) => {
                self.context_chunks(sid, turn).await
            }
            _ => super::compose::artifact_chunks(turn),
        };
        (begun, chunks)
    }
}
