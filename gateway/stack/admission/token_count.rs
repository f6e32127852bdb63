//! [`TokenCount`]: what admission counted, carried on for the later stages (rate limits,
//! routing's KV cost, the response guard), with the exact count finishing in the
//! background when admission settled on the byte bound.

use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::count::{run_blocking, Measured, Pending, PromptTokens};
use crate::fleet::CountRules;
use crate::fleet::KvCost;
use crate::stack::routing::KvCostEstimate;
use kvgate_tokenize::ModelTokenizer;

type ExactFuture = Shared<BoxFuture<'static, Option<Arc<[u64]>>>>;

/// The token counts of an admitted request, carried on as a request extension for later
/// stages (rate limits, the response guard).
#[derive(Debug, Clone)]
pub struct TokenCount {
    /// Per sample: exact when admission needed it, else the bound it admitted on.
    pub prompt_tokens: Vec<PromptTokens>,
    /// Per sample: the new tokens admission allowed for.
    pub max_new_tokens: Vec<u64>,
    /// The `max_tokens` admission chose for a chat that gave none (also sent to the engine).
    pub clamped_max_new: Option<u64>,
    /// The model's context window and the sequences per sample (`n`): a sample's new
    /// tokens never count past what the window leaves each sequence ([`Self::kv_cost`]).
    pub(super) window: u64,
    pub(super) fanout: u64,
    exact: Option<ExactFuture>,
    /// The rules these counts were prepared by.
    pub(super) rules: CountRules,
    /// The counts by other rules, when the request's pools prepare chats differently.
    pub(super) others: Vec<TokenCount>,
}

impl TokenCount {
    /// The count of a request kvgate answers itself: no prompt goes to an engine.
    pub(super) fn none() -> Self {
        Self {
            prompt_tokens: Vec::new(),
            max_new_tokens: Vec::new(),
            clamped_max_new: None,
            window: u64::MAX,
            fanout: 1,
            exact: None,
            rules: CountRules::default(),
            others: Vec::new(),
        }
    }

    pub(super) fn new(
        measured: &[Measured],
        max_new_tokens: Vec<u64>,
        tokenizer: &Arc<ModelTokenizer>,
        permits: &Arc<Semaphore>,
    ) -> Self {
        let prompt_tokens: Vec<PromptTokens> = measured.iter().map(|m| m.tokens).collect();
        let pending: Vec<(usize, Pending)> = measured
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.pending.clone().map(|p| (i, p)))
            .collect();
        let exact = (!pending.is_empty()).then(|| {
            let known = prompt_tokens.clone();
            let task = tokio::spawn(run_blocking(pending, tokenizer.clone(), permits.clone()));
            async move {
                let counts = task.await.ok()?.ok()?;
                let mut all: Vec<u64> = known.iter().map(|t| t.value()).collect();
                for (i, n) in counts {
                    all[i] = n;
                }
                Some(Arc::from(all))
            }
            .boxed()
            .shared()
        });
        Self {
            prompt_tokens,
            max_new_tokens,
            clamped_max_new: None,
            window: u64::MAX,
            fanout: 1,
            exact,
            rules: CountRules::default(),
            others: Vec::new(),
        }
    }

    /// The counts as an engine of `rules` sees the request (the guard compares the serving
    /// pool's engine with them).
    pub fn for_rules(&self, rules: CountRules) -> &TokenCount {
        std::iter::once(self)
            .chain(&self.others)
            .find(|c| c.rules == rules)
            .unwrap_or(self)
    }

    /// The exact prompt counts of every sample (waits for the background count if admission
    /// did not need it). `None` when counting failed.
    pub async fn exact(&self) -> Option<Arc<[u64]>> {
        match &self.exact {
            Some(f) => f.clone().await,
            None => Some(self.prompt_tokens.iter().map(|t| t.value()).collect()),
        }
    }

    /// Sum of the prompt sizes admission knows (exact or bound).
    pub fn prompt_total(&self) -> u64 {
        self.prompt_tokens.iter().map(|t| t.value()).sum()
    }

    /// What the request holds in a worker's KV, summed over its samples: the prompt (exact
    /// when the count is known by now — it is never waited for here — else admission's
    /// bound) and the prompt plus the new tokens allowed, clipped to the context window.
    pub fn cost(&self) -> KvCost {
        let exact = self
            .exact
            .as_ref()
            .and_then(|f| f.peek().cloned().flatten());
        let mut cost = KvCost::ZERO;
        for (i, (known, &new)) in self
            .prompt_tokens
            .iter()
            .zip(&self.max_new_tokens)
            .enumerate()
        {
            let prompt = exact
                .as_ref()
                .and_then(|e| e.get(i).copied())
                .unwrap_or(known.value());
            let fits = self
                .window
                .saturating_sub(prompt)
                .saturating_mul(self.fanout);
            cost.prompt = cost.prompt.saturating_add(prompt);
            cost.total = cost
                .total
                .saturating_add(prompt.saturating_add(new.min(fits)));
        }
        cost
    }

    /// Exact prompt tokens plus the new tokens allowed, over every sample: what a
    /// tokens-per-minute limit reserves (waits for the background count; the bound only if
    /// counting failed).
    pub async fn exact_total(&self) -> u64 {
        let prompts = match self.exact().await {
            Some(exact) => exact.iter().sum(),
            None => self.prompt_total(),
        };
        prompts + self.max_new_tokens.iter().sum::<u64>()
    }
}

impl KvCostEstimate for TokenCount {
    fn kv_cost(&self) -> KvCost {
        self.cost()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cost_sums_samples_and_clips_new_tokens_to_the_window() {
        let count = |prompts: Vec<PromptTokens>, new: Vec<u64>, window: u64, fanout: u64| {
            TokenCount {
                prompt_tokens: prompts,
                max_new_tokens: new,
                clamped_max_new: None,
                window,
                fanout,
                exact: None,
                rules: CountRules::default(),
                others: Vec::new(),
            }
            .cost()
        };
        let one = count(vec![PromptTokens::Exact(100)], vec![50], 1000, 1);
        assert_eq!((one.prompt, one.total), (100, 150));
        // Two samples add up; the bound counts until the exact count is known.
        let two = count(
            vec![PromptTokens::Exact(100), PromptTokens::AtMost(40)],
            vec![50, 10],
            1000,
            1,
        );
        assert_eq!((two.prompt, two.total), (140, 200));
        // New tokens never count past the window (per sequence, n of them).
        let clipped = count(vec![PromptTokens::Exact(900)], vec![500], 1000, 1);
        assert_eq!((clipped.prompt, clipped.total), (900, 1000));
        let fanned = count(vec![PromptTokens::Exact(900)], vec![500], 1000, 2);
        assert_eq!(fanned.total, 1100);
    }
}
