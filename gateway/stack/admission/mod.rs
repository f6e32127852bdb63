//! Admission (I2, I3): count the prompt exactly as the engine will, and refuse what cannot
//! fit before any byte goes downstream.
//!
//! Sits between parsing and routing. For every pool that could serve the request (its
//! model's pools, weight > 0, eligible workers, the right engine for the endpoint) it checks
//! each sample against the pool's [`PoolBudget`]; the request continues to the pools it fits
//! and is refused with HTTP 400 `context_length_exceeded` when it fits none. Counting starts
//! with a byte bound and counts exactly only when the bound does not settle it.
//!
//! Reads: `InferenceRequest`. Writes: [`TokenCount`] (also as routing's `RequestCost`: the
//! KV the request will hold), [`AdmittedPools`] and, for requests to pools that choose
//! their worker by prompt prefix, routing's `RequestBlocks` (`blocks`); records the
//! new-token default it assumed (model default or tenant cap) as an engine directive.

mod blocks;
mod budget;
mod chat;
mod count;
mod images;
mod prompt;
mod token_count;
mod too_long;

pub use crate::stack::routing::AdmittedPools;
pub use blocks::{PrefixHashing, PromptBlocks};
pub use budget::{
    sglang_max_req_input_len, worker_input_limit, Bound, PoolBudget, Violation, WorkerBound,
};
pub use chat::{render_chat, render_chat_with_media};
pub use count::PromptTokens;
pub use prompt::{MaxNew, COMPLETIONS_DEFAULT_MAX_TOKENS, GENERATE_DEFAULT_MAX_NEW_TOKENS};
pub use token_count::TokenCount;
pub use too_long::PromptTooLong;

use bytes::Bytes;
use http::Request;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

use crate::error::GatewayError;
use crate::fleet::CountRules;
use crate::fleet::Fleet;
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::auth::{AuthContext, TenantPolicy};
use crate::stack::routing::{PinnedWorker, PoolChoice, RequestBlocks, RequestCost};
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};
use crate::vision::ModelVision;
use count::Measured;
use kvgate_tokenize::ModelTokenizer;

/// Response header naming the `max_tokens` admission chose for a chat that gave none.
pub const CLAMPED_MAX_TOKENS_HEADER: &str = "x-kvgate-max-tokens";

/// What admission knows of one model.
#[derive(Debug, Clone)]
pub struct ModelAdmission {
    pub tokenizer: Arc<ModelTokenizer>,
    pub context_window: u64,
    pub default_max_new_tokens: Option<u64>,
    /// A model that takes images (`[models.vision]`), and the id of its image token.
    pub vision: Option<(Arc<ModelVision>, Option<u32>)>,
}

/// Shared state of the admission stage.
#[derive(Debug)]
pub struct AdmissionState {
    pub models: HashMap<String, ModelAdmission>,
    pub fleet: Arc<Fleet>,
    /// Bounds concurrent exact counts (and long prompts' block hashing) on the blocking
    /// pool.
    pub permits: Arc<Semaphore>,
    /// Hashing prompts into KV blocks for prefix-aware routing (None: `[prefix_routing]`
    /// is off).
    pub prefix: Option<PrefixHashing>,
}

/// The admission stage.
#[derive(Debug, Clone)]
pub struct Admit {
    state: Arc<AdmissionState>,
}

/// The admission stage as a layer.
pub type AdmitLayer = StageLayer<Admit>;

impl Admit {
    /// Admit against `state`.
    pub fn layer(state: Arc<AdmissionState>) -> AdmitLayer {
        StageLayer::new(Admit { state })
    }
}

// === impl Admit ===

impl Stage for Admit {
    fn handle(&self, mut request: Request<Bytes>, next: Next) -> StageFuture {
        let state = self.state.clone();
        Box::pin(async move {
            let auth = request.extensions().get::<AuthContext>().cloned();
            let choice = request
                .extensions()
                .get::<PoolChoice>()
                .map(|c| c.0.clone());
            // A continuation of a stored response can only be served where it is stored.
            let choice = match (request.extensions().get::<PinnedWorker>(), choice) {
                (Some(pin), Some(c)) if c != pin.pool => {
                    return Err(GatewayError::invalid(
                        format!(
                            "response {} is stored in pool `{}`; it cannot continue in pool `{c}`",
                            pin.response_id, pin.pool
                        ),
                        Some("previous_response_id"),
                    )
                    .into())
                }
                (Some(pin), _) => Some(pin.pool.clone()),
                (None, c) => c,
            };
            let parsed = request
                .extensions_mut()
                .get_mut::<InferenceRequest>()
                .ok_or_else(|| GatewayError::Internal("admission ran before parsing".into()))?;
            let tenant = auth.as_ref().map(|a| &*a.policy);
            let (count, pools, blocks) = admit(&state, parsed, tenant, choice.as_deref()).await?;
            let clamped = count.clamped_max_new;
            if let Some(blocks) = blocks {
                request.extensions_mut().insert(blocks);
            }
            // Routing claims workers for what the request will hold in their KV.
            request
                .extensions_mut()
                .insert(RequestCost(Arc::new(count.clone())));
            request.extensions_mut().insert(count);
            request.extensions_mut().insert(pools);
            let mut response = next.oneshot(request).await?;
            if let Some(n) = clamped {
                // A chat without max_tokens was given what fits; the client can see how much.
                response
                    .headers_mut()
                    .insert(CLAMPED_MAX_TOKENS_HEADER, http::HeaderValue::from(n));
            }
            Ok(response)
        })
    }
}

/// The admission decision for one parsed request; `choice` is the pool the client named
/// (`x-kvgate-pool`, already allowed for the tenant), the only one it may then land on.
/// With it, the prompt's KV blocks when an admitted pool chooses its worker by prefix.
pub async fn admit(
    state: &AdmissionState,
    parsed: &mut InferenceRequest,
    tenant: Option<&TenantPolicy>,
    choice: Option<&str>,
) -> Result<(TokenCount, AdmittedPools, Option<RequestBlocks>), GatewayError> {
    if parsed.endpoint.is_local() || parsed.endpoint.is_stored_response() {
        // `/tokenize`, `/detokenize` and `count_tokens` never reach an engine, a stored
        // response's GET and cancel carry no prompt: nothing to admit (the rate limits still
        // take the request; `local_answer` or `responses::proxy` answers it).
        return Ok((TokenCount::none(), AdmittedPools(Arc::from([])), None));
    }
    let model = state.models.get(&parsed.model).ok_or_else(|| {
        GatewayError::Internal(format!("no tokenizer loaded for `{}`", parsed.model))
    })?;
    let tenant_new_cap = tenant.and_then(|t| t.max_new_tokens);
    // A tenant cap on new tokens is also the default (and is sent to the engine).
    let default_new = match (model.default_max_new_tokens, tenant_new_cap) {
        (Some(d), Some(c)) => Some(d.min(c)),
        (d, c) => d.or(c),
    };
    if let Some(cap) = tenant_new_cap {
        for i in 0..parsed.batch {
            if let Some(asked) = parsed.requested_max_new(i)?.filter(|&n| n > cap) {
                return Err(GatewayError::invalid(
                    format!("max new tokens {asked} is over this tenant's cap of {cap}"),
                    Some(parsed.max_tokens_param()),
                ));
            }
        }
    }
    // The engine must not generate more than was admitted: dispatch sends this default.
    parsed.directives.default_max_new_tokens = default_new;
    let window = model.context_window;
    let fanout = parsed.fanout()?;
    let mut budgets = candidate_budgets(state, parsed, tenant, window, choice)?;
    let param = parsed.prompt_param();
    let cap = tenant.and_then(|t| t.max_prompt_tokens.map(|c| (t.name.clone(), c)));
    // A chat is counted as each candidate pool's engine prepares it: one measure per set
    // of rules (nearly always one; a model's pools of different engines may need two).
    let groups: Vec<CountRules> = if parsed.endpoint == Endpoint::ChatCompletions {
        let mut rules: Vec<CountRules> = Vec::new();
        for b in &budgets {
            if !rules.contains(&b.rules) {
                rules.push(b.rules);
            }
        }
        rules
    } else {
        vec![budgets.first().map_or(CountRules::default(), |b| b.rules)]
    };
    let group_of = |b: &PoolBudget| groups.iter().position(|r| *r == b.rules).unwrap_or(0);
    // A chat's images are read (their headers) before anything is counted.
    let images = images::chat_images(model, parsed, &budgets).await?;
    if let Some(images) = images.as_ref().filter(|i| i.fetched_any()) {
        // An image kvgate fetched goes only to pools that allow fetching it.
        budgets.retain(|b| images.vision.fetches(&b.pool));
    }
    let mut measured: Vec<Vec<Measured>> = {
        let samples = prompt::samples(parsed, default_new)?;
        let ids_first = blocks::wanted(state, &parsed.model);
        groups
            .iter()
            .enumerate()
            .map(|(g, rules)| {
                count::measure(
                    &samples,
                    &model.tokenizer,
                    &parsed.model,
                    *rules,
                    ids_first && g == 0,
                    images.as_ref(),
                )
            })
            .collect::<Result<_, _>>()?
    };
    let pending =
        |measured: &[Vec<Measured>]| measured.iter().flatten().any(|m| m.pending.is_some());
    if groups.len() > 1
        || measured
            .iter()
            .flatten()
            .any(|m| m.max_new == MaxNew::RestOfWindow && m.pending.is_some())
    {
        // A chat without max_tokens is clamped to what fits beyond its prompt: that needs
        // the exact count, not the bound (which would clamp it short). Pools of different
        // rules are compared on exact counts too.
        for group in &mut measured {
            count::count_exactly(group, &model.tokenizer, &state.permits).await?;
        }
    }
    let judge_all = |measured: &[Vec<Measured>]| -> Vec<Result<(), Box<PromptTooLong>>> {
        budgets
            .iter()
            .map(|b| judge(b, &measured[group_of(b)], fanout, cap.as_ref()))
            .collect()
    };
    let mut verdicts = judge_all(&measured);
    if verdicts.iter().any(Result::is_err) && pending(&measured) {
        // The bound did not settle it: count exactly (a refusal then reports the exact
        // count), then judge again.
        for group in &mut measured {
            count::count_exactly(group, &model.tokenizer, &state.permits).await?;
        }
        verdicts = judge_all(&measured);
    }
    let admitted: Vec<Arc<str>> = budgets
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| v.is_ok())
        .map(|(b, _)| b.pool.clone())
        .collect();
    if admitted.is_empty() {
        // Refuse with the most lenient pool's reason: no pool would have taken it.
        let (i, _) = budgets
            .iter()
            .enumerate()
            .max_by_key(|(_, b)| b.max_prompt_tokens())
            .unwrap_or((0, &budgets[0]));
        if let Some(Err(refusal)) = verdicts.into_iter().nth(i) {
            let mut refusal = *refusal;
            refusal.param = param;
            if parsed.batch == 1 {
                refusal.sample = None;
            }
            return Err(refusal.into());
        }
    }
    let admitted_budgets: Vec<&PoolBudget> = budgets
        .iter()
        .filter(|b| admitted.contains(&b.pool))
        .collect();
    // A sample with no allowance (chat without max_tokens) gets what fits in every pool it
    // may land on, and the engine is told so: it never generates past the KV it has.
    let samples = measured.first().map_or(0, Vec::len);
    let max_new: Vec<u64> = (0..samples)
        .map(|i| {
            admitted_budgets
                .iter()
                .map(|b| new_tokens_for(&measured[group_of(b)][i], b, fanout))
                .min()
                .unwrap_or(0)
        })
        .collect();
    let clamped = (0..samples)
        .filter(|&i| measured[0][i].max_new == MaxNew::RestOfWindow)
        .map(|i| max_new[i] / fanout)
        .min();
    if let Some(n) = clamped {
        parsed.directives.default_max_new_tokens = Some(n);
    }
    // The group of the first admitted pool is the one routed on (and counted for limits).
    let primary = admitted_budgets.first().map_or(0, |b| group_of(b));
    // Affinity is an optimisation: a request whose blocks cannot be had is routed by load.
    let blocks = blocks::start(
        state,
        &model.tokenizer,
        parsed,
        (&measured[primary], groups[primary].chat),
        &admitted,
    )
    .unwrap_or_else(|e| {
        tracing::debug!(error = %e, "prompt blocks not computed: routed by load");
        None
    });
    let finish = |group: &[Measured], rules: CountRules| {
        let mut count = TokenCount::new(group, max_new.clone(), &model.tokenizer, &state.permits);
        count.clamped_max_new = clamped;
        count.window = window;
        count.fanout = fanout.max(1);
        count.rules = rules;
        count
    };
    let mut count = finish(&measured[primary], groups[primary]);
    count.others = groups
        .iter()
        .enumerate()
        .filter(|(g, _)| *g != primary)
        .map(|(g, rules)| finish(&measured[g], *rules))
        .collect();
    Ok((count, AdmittedPools(admitted.into()), blocks))
}

/// The pools that could serve this request for this tenant: the model's pools the tenant
/// may use (403 when none), with the right engine and eligible workers (503 when none).
fn candidate_budgets(
    state: &AdmissionState,
    parsed: &InferenceRequest,
    tenant: Option<&TenantPolicy>,
    window: u64,
    choice: Option<&str>,
) -> Result<Vec<PoolBudget>, GatewayError> {
    let of_model = state.fleet.pools_of(&parsed.model);
    if let Some(chosen) = choice.filter(|c| !of_model.iter().any(|p| &*p.name == *c)) {
        return Err(GatewayError::UnknownPool {
            pool: chosen.to_owned(),
            model: parsed.model.clone(),
        });
    }
    let allowed: Vec<_> = of_model
        .iter()
        .filter(|p| choice.is_none_or(|c| c == &*p.name))
        .filter(|p| tenant.is_none_or(|t| p.serves_tenant(&t.name, t.pools.as_ref())))
        .collect();
    if allowed.is_empty() && !of_model.is_empty() {
        return Err(GatewayError::ModelNotAllowed {
            tenant: tenant.map(|t| t.name.to_string()).unwrap_or_default(),
            model: parsed.model.clone(),
        });
    }
    let needs = parsed.endpoint.engine_needs();
    if !allowed.is_empty()
        && !allowed
            .iter()
            .any(|p| p.fits_route(needs.sglang, needs.unified))
    {
        // No state of the workers would change this: a 400 saying so, not "retry".
        let what = match (needs.sglang, needs.unified) {
            (true, true) => "a unified SGLang pool",
            (true, false) => "an SGLang pool",
            _ => "a unified pool (prefill-only requests run in one engine process)",
        };
        return Err(GatewayError::invalid(
            format!(
                "model `{}` is not served on {} here: that route needs {what}",
                parsed.model,
                parsed.endpoint.path()
            ),
            None,
        ));
    }
    let mut reasons = Vec::new();
    let budgets: Vec<PoolBudget> = allowed
        .into_iter()
        .filter(|p| {
            match p.refusal_for(
                parsed.endpoint.engine_needs().sglang,
                parsed.endpoint.engine_needs().unified,
                choice.is_some(),
            ) {
                Some(r) => {
                    reasons.push(r);
                    false
                }
                None => true,
            }
        })
        .map(|p| PoolBudget::of(p, window))
        .collect();
    if budgets.is_empty() {
        return Err(GatewayError::NoEligibleWorker {
            model: parsed.model.clone(),
            retry_after: crate::fleet::retry_after(of_model),
            reason: if reasons.is_empty() {
                "no pool serves this model".into()
            } else {
                reasons.join("; ")
            },
        });
    }
    Ok(budgets)
}

/// The new tokens a sample needs in `budget`'s pool, over all its `fanout` sequences: its
/// own number each, or (none given) what the pool's window and decode KV leave beyond the
/// prompt, shared evenly — at least one each, so a prompt that leaves no room is refused
/// rather than sent to generate nothing.
fn new_tokens_for(m: &Measured, budget: &PoolBudget, fanout: u64) -> u64 {
    match m.max_new {
        MaxNew::Tokens(n) => n.saturating_mul(fanout),
        MaxNew::RestOfWindow => {
            let each = (budget.room_for_new_tokens(m.tokens.value()) / fanout).max(1);
            each * fanout
        }
    }
}

/// One pool's verdict: admitted, or the first sample's refusal.
fn judge(
    budget: &PoolBudget,
    measured: &[Measured],
    fanout: u64,
    tenant_cap: Option<&(Arc<str>, u64)>,
) -> Result<(), Box<PromptTooLong>> {
    for (i, m) in measured.iter().enumerate() {
        let prompt = m.tokens.value();
        let max_new = new_tokens_for(m, budget, fanout);
        let capped = match tenant_cap {
            Some((tenant, cap)) if prompt > *cap => Err(Violation {
                includes_new_tokens: false,
                counted: prompt,
                limit: *cap,
                bound: Bound::TenantCap {
                    tenant: tenant.clone(),
                    cap: *cap,
                },
            }),
            _ => Ok(()),
        };
        if let Err(violation) = capped.and_then(|()| budget.check(prompt, max_new)) {
            return Err(Box::new(PromptTooLong {
                sample: Some(i),
                prompt_tokens: prompt,
                max_new_tokens: max_new,
                violation,
                param: "",
            }));
        }
    }
    Ok(())
}
