//! The reasoner (AGN-027 layer E): the only loop of a turn, and the only layer that holds the
//! others. It composes each request (B), calls the model through the [`Pipeline`]'s model
//! caller (C), runs server tools through its server tools (D), applies mode changes and decides
//! whether the turn is done, waits for client tools (or for a person's approval of an MCP
//! call), or fails; user turns enter here, continuations through `continuation` and then here.
//! Owns: the loop, iteration limits, mode changes (stored by F with the tool's output). Must
//! not: write the turn's state: it holds no store writer, only the lifecycle (F) whose
//! transitions move the run, and a reader.

use std::sync::Arc;

use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::Pipeline;
use super::backends;
use super::compose;
use super::lifecycle::{Begin, Run};
use super::model_call;
use super::outcome::{
    CallEnd, Interrupted, RetryableFailure, Settled, TurnPrint, TurnResult, permanent,
    store_failure,
};
use super::server_tools::ToolEnd;
use crate::catalog::{ToolDef, ToolLocation};
use crate::contract::request::JsonText;
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, ToolCall, ToolCallId, UserTurn};
use crate::live::LiveTurn;
use crate::llm::OutputItem;
use crate::mcp::{McpTool, approval};
use crate::metrics::ToolOutcome as Counted;
use crate::store::{ContextIds, TurnProgress, TurnRecord, now_rfc3339};

/// Where a user turn stands once its run is open: answered already, or ready to reason.
pub(super) enum Opened {
    /// Settled without a model call (a stored result, or contexts refused).
    Settled(Settled),
    /// The run and what its first model call is made from.
    Reason {
        run: Run,
        progress: TurnProgress,
        input: Vec<Value>,
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
                if let Some(held) = begun.held {
                    held.release().await;
                }
                return answer.map(Opened::Settled);
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
                    TurnRecord::queued(sid.clone(), tid.clone(), print.value(), String::new())
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
        let mut changed = loaded.is_none();
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
            TurnRecord::queued(sid.clone(), tid.clone(), print.value(), mode.key.clone())
                .with_streaming(turn.streaming())
        });
        let resuming = record.checkpoint.is_some();
        let start = super::lifecycle::Start {
            changed,
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
                input: Vec::new(),
                previous,
            });
        }
        let first_call =
            run.session().previous_response_id.is_none() && run.session().conversation.is_empty();
        let mut input = Vec::new();
        if first_call {
            input.push(compose::system_message(&boot));
        }
        input.push(compose::user_message(
            &run.session().mode_key,
            turn,
            run.session().solution_context.as_deref(),
            &chunks,
        ));
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

    /// The loop: call → run server tools → call again, until text or client tools.
    ///
    /// The steps that settle the turn, save a checkpoint or run a server tool are boxed: a
    /// turn's task is as large as its largest state, and a turn spends its time in the model
    /// call, which is small; unboxed, every waiting turn carried the size of the settling
    /// states too (measured with `size_of_val` on a release build: 21.7 → 13 KB per turn's
    /// task, with the record boxed in [`Run`]).
    ///
    /// Written as a function that returns its loop, not as an `async fn`: an `async fn` keeps
    /// its arguments where they arrived and moves them again into its body, so every waiting
    /// turn carried the run and its progress twice (~900 bytes); an `async move` block uses
    /// what it captured in place.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold its arguments twice"
    )]
    pub(super) fn reason(
        &self,
        mut run: Run,
        mut progress: TurnProgress,
        mut input: Vec<Value>,
        mut previous: Option<String>,
    ) -> impl Future<Output = Result<Settled, RetryableFailure>> + '_ {
        async move {
            let mut api_warnings: Vec<ErrorMessage> = Vec::new();
            loop {
                // The tokens of an answer without tool calls, counted beside the write that
                // settles the turn.
                let mut uncounted = None;
                // Resume from a checkpoint (a re-run after a crash), or ask the model.
                let checkpoint = match run.record().checkpoint.clone() {
                    Some(cp) if input.is_empty() => {
                        info!(response_id = %cp.response.id, "resuming the turn from its checkpoint");
                        progress = cp.progress;
                        Some(cp.response)
                    }
                    _ => None,
                };
                // The tools of this step: those the call offers are those its answer may call.
                let tools_mode = compose::tools_mode(&self.catalog, &progress);
                let mcp = self
                    .tools
                    .offered(&tools_mode.key, run.session().session_id.tenant());
                let from_model = checkpoint.is_none();
                let response = match checkpoint {
                    Some(response) => response,
                    None => {
                        if progress.iterations >= self.life.settings.max_iterations {
                            let result = InvokeResult::failure(permanent(
                                ErrorCode::IterationLimit,
                                format!(
                                    "the turn reached the limit of {} model calls without a final answer",
                                    self.life.settings.max_iterations
                                ),
                            ));
                            return Box::pin(self.life.fail_turn(run, result)).await;
                        }
                        let sent = std::mem::take(&mut input);
                        match self
                            .model
                            .call_model(
                                &mut run,
                                &mut progress,
                                (&tools_mode, &mcp),
                                sent,
                                previous.as_deref(),
                                &self.life,
                            )
                            .await
                        {
                            Err(retryable) => {
                                return Err(Box::pin(self.life.hand_back(run, retryable)).await);
                            }
                            Ok(Err(CallEnd::Failed(failed))) => {
                                return Box::pin(self.life.fail_turn(run, *failed)).await;
                            }
                            Ok(Err(CallEnd::Cancelled)) => {
                                return Box::pin(self.life.cancel_turn(run)).await;
                            }
                            // An answer that calls tools is saved before any of them runs: a
                            // re-run resumes here instead of running them twice. An answer without
                            // calls settles the turn in the next write, so a checkpoint would be a
                            // second write of the same turn one round trip earlier; a run that dies
                            // in between asks the model again, as one that dies during the call.
                            Ok(Ok((response, spent))) if model_call::calls_tools(&response) => {
                                let apart = self.life.count_in_write(&mut run, spent);
                                let saved =
                                    Box::pin(self.life.checkpoint(&mut run, &response, &progress));
                                let saved = match apart {
                                    Some(spent) => self.counting(spent, saved).await,
                                    None => saved.await,
                                };
                                if let Err(f) = saved {
                                    return Err(Box::pin(self.life.hand_back(run, f)).await);
                                }
                                response
                            }
                            Ok(Ok((response, spent))) => {
                                uncounted = Some(spent);
                                response
                            }
                        }
                    }
                };
                let mut tools: Vec<&ToolDef> = self.catalog.tools_for(&tools_mode);
                tools.extend(mcp.iter().map(|t| &t.def));

                let mut texts = Vec::new();
                let mut refusals = Vec::new();
                let mut calls = Vec::new();
                let mut approvals: Vec<ToolCall> = Vec::new();
                for item in &response.items {
                    match item {
                        OutputItem::Text(t) => texts.push(t.clone()),
                        OutputItem::Refusal(r) => refusals.push(r.clone()),
                        OutputItem::FunctionCall {
                            call_id,
                            name,
                            arguments,
                        } => calls.push((call_id.clone(), name.clone(), arguments.clone())),
                        OutputItem::Reasoning => {}
                        // Ran by the model server during the call: recorded once, when it came.
                        OutputItem::Hosted(call) if from_model => {
                            super::hosted::note(&mut run, &self.life.metrics, call);
                        }
                        OutputItem::Hosted(_) => {}
                        OutputItem::ApprovalRequest {
                            id,
                            server_label,
                            name,
                            arguments,
                        } => approvals.extend(super::hosted::question(
                            // Counted as asked once, when the answer came (not again on resuming).
                            from_model.then_some(&*self.life.metrics),
                            (id, server_label, name, arguments),
                        )),
                        OutputItem::Unknown { item_type: kind } => {
                            warn!(kind = %kind, "ignoring an unknown output item");
                            api_warnings.push(ErrorMessage::new(
                            ErrorCode::UnknownOutputItem,
                            format!(
                                "the model returned an output item of type {kind:?}; it was ignored"
                            ),
                        ));
                        }
                    }
                }

                if calls.is_empty() && approvals.is_empty() {
                    let mut text = texts.join("\n\n");
                    if text.is_empty() {
                        text = refusals.join("\n\n");
                    }
                    let apart =
                        uncounted.and_then(|spent| self.life.count_in_write(&mut run, spent));
                    let settle = || async {
                        if text.is_empty() {
                            let result = InvokeResult::failure(permanent(
                                ErrorCode::LlmBadResponse,
                                "the model answered with neither text nor tool calls",
                            ));
                            return self.life.fail_turn(run, result).await;
                        }
                        self.life
                            .complete_turn(run, progress, response.id, text, api_warnings)
                            .await
                    };
                    return match apart {
                        Some(spent) => self.counting(spent, super::boxed::boxed(settle)).await,
                        // Counted by the write itself, or a run resumed from its checkpoint:
                        // counted when the answer came.
                        None => super::boxed::boxed(settle).await,
                    };
                }
                debug_assert!(
                    uncounted.is_none(),
                    "an answer with calls is counted beside its checkpoint"
                );

                // Run server tools (in order), collect client calls; AGN-011 §4.4: the tool list is
                // the one chosen before the loop.
                let mut outputs: Vec<(String, String)> = Vec::new();
                let mut client_calls: Vec<ToolCall> = approvals;
                for (call_id, name, arguments) in calls {
                    let def = tools.iter().find(|t| t.name == name);
                    match def.map(|d| d.location) {
                        None => {
                            warn!(tool = %name, "model called a tool this mode does not offer");
                            let out = json!({"error": format!("Tool '{name}' is not available in this mode.")}).to_string();
                            outputs.push((call_id, out));
                        }
                        Some(ToolLocation::Client) => {
                            match (ToolCallId::parse(&call_id), JsonText::parse(&arguments)) {
                                (Ok(id), Ok(args)) => client_calls.push(ToolCall {
                                    tool_call_id: id,
                                    name,
                                    arguments_json: args,
                                }),
                                _ => {
                                    let out = json!({"error": format!("The call to '{name}' has invalid arguments JSON or call id; call it again with valid JSON.")}).to_string();
                                    outputs.push((call_id, out));
                                }
                            }
                        }
                        Some(ToolLocation::Server) => {
                            let mcp_tool = mcp.iter().find(|t| t.def.name == name);
                            // A call that needs a person's approval waits for it as a client call
                            // (one approved and run already is in the ledger: D replays it).
                            if let Some(tool) = mcp_tool.filter(|t| {
                                t.needs_approval && !run.record().tool_ledger.contains_key(&call_id)
                            }) {
                                match ToolCallId::parse(&call_id) {
                                    Ok(id) => {
                                        let counted = Counted::ApprovalAsked;
                                        self.life.metrics.tools.call(
                                            &tool.source,
                                            &tool.remote,
                                            counted,
                                            None,
                                        );
                                        info!(tool = %name, %call_id, "the call waits for a person's approval");
                                        client_calls
                                            .push(approval::question(&id, tool, &arguments));
                                    }
                                    Err(_) => {
                                        let out = json!({"error": format!("The call to '{name}' has an invalid call id; call it again.")}).to_string();
                                        outputs.push((call_id, out));
                                    }
                                }
                                continue;
                            }
                            if let Some(live) = run.live() {
                                live.progress(format!("running the server tool {name}"));
                            }
                            match Box::pin(self.server_tool_call(
                                &mut run,
                                &mut progress,
                                &call_id,
                                (&name, mcp_tool),
                                &arguments,
                            ))
                            .await
                            {
                                Ok(Ok(out)) => outputs.push((call_id, out)),
                                Ok(Err(failed)) => {
                                    return Box::pin(self.life.fail_turn(run, *failed)).await;
                                }
                                Err(retryable) => {
                                    return Err(Box::pin(self.life.hand_back(run, retryable)).await);
                                }
                            }
                        }
                    }
                }
                if !client_calls.is_empty() {
                    return Box::pin(self.life.await_client_tools(
                        run,
                        progress,
                        response.id,
                        client_calls,
                        outputs,
                    ))
                    .await;
                }
                input = outputs
                    .iter()
                    .map(|(id, out)| compose::tool_output(id, out))
                    .collect();
                previous = Some(response.id);
            }
        }
    }

    /// One server tool call: layer D runs it (or replays it from the ledger); a mode change it
    /// asks for is applied here, the only place one is; then its output is recorded in the
    /// turn's ledger, so a resumed run neither runs the tool nor changes the mode again.
    pub(super) async fn server_tool_call(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        call_id: &str,
        (name, mcp_tool): (&str, Option<&Arc<McpTool>>),
        arguments: &str,
    ) -> Result<Result<String, Box<TurnResult>>, RetryableFailure> {
        let (started, start_ms) = (std::time::Instant::now(), run.record().ms_since_accepted());
        let step = match self
            .tools
            .run(
                run,
                progress,
                call_id,
                (name, mcp_tool),
                arguments,
                &self.life,
            )
            .await?
        {
            ToolEnd::Step(step) => step,
            ToolEnd::Fail(result) => return Ok(Err(Box::new(result))),
        };
        let attempt = run.record().attempts;
        run.note_tool(crate::state::ToolNote {
            tool_call_id: call_id.to_string(),
            name: name.to_string(),
            arguments: arguments.to_string(),
            replayed: !step.record,
            execution_ms: if step.record {
                started.elapsed().as_millis() as u64
            } else {
                0
            },
            attempt,
            source: step.mcp.as_ref().map(|m| m.source.clone()),
            outcome: step.mcp.as_ref().map(|m| m.outcome.to_string()),
            repeated: step.mcp.as_ref().is_some_and(|m| m.repeated),
            start_ms,
            result: None,
        });
        if !step.record {
            return Ok(Ok(step.output));
        }
        let changed = self
            .life
            .record_tool_output(run, call_id, &step.output, step.effect)
            .await?;
        // The next calls of this turn carry the new mode; the last change wins.
        if changed {
            progress.mode_changes += 1;
            if progress.mode_changes == 2 {
                warn!("several mode changes in one turn; the last one wins");
                progress.user_warnings.push(
                    "The mode was changed more than once in this turn; the last change applies."
                        .into(),
                );
            }
        }
        // The checkpoint's progress must include this tool's result for a resumed run.
        run.note_progress(progress);
        Ok(Ok(step.output))
    }
}
