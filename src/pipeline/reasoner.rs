//! The reasoner (AGN-027 layer E): the only loop of a turn, and the only layer that holds the
//! others. It composes each request (B), calls the model through the [`Pipeline`]'s model
//! caller (C), runs server tools through its server tools (D), applies mode changes and decides
//! whether the turn is done, waits for client tools (or for a person's approval of an MCP
//! call), or fails; user turns enter through `opening`, continuations through `continuation`.
//! Owns: the loop, iteration limits, mode changes (stored by F with the tool's output). Must
//! not: write the turn's state: it holds no store writer, only the lifecycle (F) whose
//! transitions move the run, and a reader.

use std::sync::Arc;

use serde_json::{Value, json};
use tracing::{info, warn};

use super::Pipeline;
use super::compose;
use super::lifecycle::Run;
use super::model_call::{self, CallInput};
use super::outcome::{CallEnd, RetryableFailure, Settled, TurnResult, permanent};
use super::server_tools::ToolEnd;
use crate::catalog::{Mode, ToolDef, ToolLocation};
use crate::contract::request::JsonText;
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, ToolCall, ToolCallId};
use crate::llm::{ModelResponse, OutputItem};
use crate::mcp::{McpTool, approval};
use crate::metrics::ToolOutcome as Counted;
use crate::store::TurnProgress;
use crate::tenants::Spent;

/// What the loop hands to [`Pipeline::act`]: what its model call came to, or the answer its
/// checkpoint kept.
enum Answer {
    /// The model call's outcome, as it came.
    Called(Result<Result<(ModelResponse, Spent), CallEnd>, RetryableFailure>),
    /// The answer a checkpoint kept (a re-run after a crash), counted when it came.
    Kept(ModelResponse),
}

/// What an answer came to.
enum Step {
    /// Its server tools ran: the model is called again with their outputs.
    Again {
        run: Run,
        progress: TurnProgress,
        outputs: Vec<Value>,
        response_id: String,
    },
    /// The turn is over: settled, waiting on client tools, failed or handed back.
    Over(Result<Settled, RetryableFailure>),
}

impl Pipeline {
    /// The loop: call → run server tools → call again, until text or client tools.
    ///
    /// A turn's future is as large as its largest state and a turn spends its time in the
    /// model call, so the loop awaits nothing else: what an answer comes to (settling, a
    /// checkpoint, server tools) is [`Pipeline::act`], whose own rare steps are boxed.
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
        mut input: CallInput,
        mut previous: Option<String>,
    ) -> impl Future<Output = Result<Settled, RetryableFailure>> + '_ {
        async move {
            let mut api_warnings: Vec<ErrorMessage> = Vec::new();
            loop {
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
                // Only the model call is awaited here: whatever else a turn waits on happens
                // in `act`, so none of its state is laid out beside a waiting model call.
                let answer = if let Some(response) = checkpoint {
                    Answer::Kept(response)
                } else if progress.iterations >= self.life.settings.max_iterations {
                    let result = InvokeResult::failure(permanent(
                        ErrorCode::IterationLimit,
                        format!(
                            "the turn reached the limit of {} model calls without a final answer",
                            self.life.settings.max_iterations
                        ),
                    ));
                    return Box::pin(self.life.fail_turn(run, result)).await;
                } else {
                    let sent = std::mem::take(&mut input);
                    Answer::Called(
                        self.model
                            .call_model(
                                &mut run,
                                &mut progress,
                                (tools_mode, &mcp),
                                sent,
                                previous.as_deref(),
                                &self.life,
                            )
                            .await,
                    )
                };
                match self
                    .act(run, progress, answer, (tools_mode, &mcp), &mut api_warnings)
                    .await
                {
                    Step::Again {
                        run: back,
                        progress: now,
                        outputs,
                        response_id,
                    } => {
                        (run, progress) = (back, now);
                        input = outputs.into();
                        previous = Some(response_id);
                    }
                    Step::Over(over) => return over,
                }
            }
        }
    }

    /// What the loop does with one answer of the model: settles the turn on text, runs its
    /// server tools (in order) and collects its client tools and approvals, or fails.
    ///
    /// A step of its own, not the loop's body: a turn spends its time waiting on its model,
    /// and a future is as large as its largest state, so the answer's locals (the calls, the
    /// texts, the outputs, the settling) written in the loop were laid out beside every
    /// waiting turn's model call. Returned as an `async move` block for the reason [`reason`]
    /// is (an `async fn` would hold the run twice).
    ///
    /// [`reason`]: Pipeline::reason
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold its arguments twice"
    )]
    fn act<'a>(
        &'a self,
        mut run: Run,
        mut progress: TurnProgress,
        answer: Answer,
        (tools_mode, mcp): (&'a Mode, &'a [Arc<McpTool>]),
        api_warnings: &'a mut Vec<ErrorMessage>,
    ) -> impl Future<Output = Step> + 'a {
        async move {
            // The answer, and the tokens of one without tool calls, counted beside the write
            // that settles the turn.
            let (response, uncounted, from_model) = match answer {
                Answer::Kept(response) => (response, None, false),
                Answer::Called(Err(retryable)) => {
                    return Step::Over(Err(Box::pin(self.life.hand_back(run, retryable)).await));
                }
                Answer::Called(Ok(Err(CallEnd::Failed(failed)))) => {
                    return Step::Over(Box::pin(self.life.fail_turn(run, *failed)).await);
                }
                Answer::Called(Ok(Err(CallEnd::Cancelled))) => {
                    return Step::Over(Box::pin(self.life.cancel_turn(run)).await);
                }
                // An answer that calls tools is saved before any of them runs: a re-run
                // resumes here instead of running them twice. An answer without calls settles
                // the turn in the next write, so a checkpoint would be a second write of the
                // same turn one round trip earlier; a run that dies in between asks the model
                // again, as one that dies during the call.
                Answer::Called(Ok(Ok((response, spent)))) if model_call::calls_tools(&response) => {
                    let apart = self.life.count_in_write(&mut run, spent);
                    let saved = match apart {
                        Some(spent) => {
                            let save = || {
                                self.counting(
                                    spent,
                                    self.life.checkpoint(&mut run, &response, &progress),
                                )
                            };
                            super::boxed::boxed(save).await
                        }
                        None => {
                            Box::pin(self.life.checkpoint(&mut run, &response, &progress)).await
                        }
                    };
                    if let Err(f) = saved {
                        return Step::Over(Err(Box::pin(self.life.hand_back(run, f)).await));
                    }
                    (response, None, true)
                }
                Answer::Called(Ok(Ok((response, spent)))) => (response, Some(spent), true),
            };
            let mut tools: Vec<&ToolDef> = self.catalog.tools_for(tools_mode);
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
                let apart = uncounted.and_then(|spent| self.life.count_in_write(&mut run, spent));
                let settle = || async {
                    if text.is_empty() {
                        let result = InvokeResult::failure(permanent(
                            ErrorCode::LlmBadResponse,
                            "the model answered with neither text nor tool calls",
                        ));
                        return self.life.fail_turn(run, result).await;
                    }
                    self.life
                        .complete_turn(
                            run,
                            progress,
                            response.id,
                            text,
                            std::mem::take(api_warnings),
                        )
                        .await
                };
                return Step::Over(match apart {
                    Some(spent) => super::boxed::boxed(|| self.counting(spent, settle())).await,
                    // Counted by the write itself, or a run resumed from its checkpoint:
                    // counted when the answer came.
                    None => super::boxed::boxed(settle).await,
                });
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
                                    client_calls.push(approval::question(&id, tool, &arguments));
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
                                return Step::Over(
                                    Box::pin(self.life.fail_turn(run, *failed)).await,
                                );
                            }
                            Err(retryable) => {
                                return Step::Over(Err(Box::pin(
                                    self.life.hand_back(run, retryable),
                                )
                                .await));
                            }
                        }
                    }
                }
            }
            if !client_calls.is_empty() {
                return Step::Over(
                    Box::pin(self.life.await_client_tools(
                        run,
                        progress,
                        response.id,
                        client_calls,
                        outputs,
                    ))
                    .await,
                );
            }
            let outputs = outputs
                .iter()
                .map(|(id, out)| compose::tool_output(id, out))
                .collect();
            Step::Again {
                run,
                progress,
                outputs,
                response_id: response.id,
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
