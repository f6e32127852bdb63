use super::*;
use futures_util::FutureExt;

use crate::config::Config;

/// A chain known at once.
#[derive(Debug)]
struct Known(Arc<[u64]>);

impl super::super::BlockChain for Known {
    fn chain(&self) -> futures_util::future::BoxFuture<'static, Option<Arc<[u64]>>> {
        futures_util::future::ready(Some(self.0.clone())).boxed()
    }
}

fn pool(salted: bool) -> Pool {
    let text = format!(
        "[server]\nallow_anonymous = true\n[[models]]\nname = \"qwen3\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\ncontext_window = 1000\n[[pools]]\nname = \"p\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\ncache_salt = {salted}\nworkers = [{{ url = \"http://10.0.0.1:1\", kv_tokens = 1000 }}, {{ url = \"http://10.0.0.2:1\", kv_tokens = 1000 }}, {{ url = \"http://10.0.0.3:1\", kv_tokens = 1000 }}]\n"
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/x.toml");
    let config = Config::from_toml(&text, &path).unwrap();
    let fleet = crate::fleet::Fleet::from_config(&config);
    // The only owner: take the pool out of its Arc.
    let pool = fleet.pool("p").unwrap().clone();
    drop(fleet);
    Arc::try_unwrap(pool).unwrap()
}

fn routing(margin: f64) -> PrefixRouting {
    let config = PrefixRoutingConfig {
        balance_margin: margin,
        ..PrefixRoutingConfig::default()
    };
    let salter = crate::stack::isolate::CacheSalter::new(b"secret");
    PrefixRouting::from_config(&config, Arc::new(salter))
}

fn blocks() -> RequestBlocks {
    let ids: Vec<u32> = (0..70).collect();
    RequestBlocks(Arc::new(Known(Arc::from(blocks::chain(&ids, 16)))))
}

async fn affinity<'p>(pool: &'p Pool, routing: &PrefixRouting, tenant: &str) -> Affinity<'p> {
    routing
        .affinity(pool, Some(&blocks()), Some(tenant))
        .await
        .expect("a pool of three chooses by prefix")
}

fn workers(pool: &Pool) -> Vec<Arc<Worker>> {
    pool.prefix_workers().to_vec()
}

#[tokio::test]
async fn the_prefix_wins_within_the_margin_and_load_past_it() {
    let pool = pool(true);
    let routing = routing(0.25);
    let a = affinity(&pool, &routing, "t").await;
    assert_eq!(a.keys().len(), 4, "70 tokens: four full blocks of 16");
    let ws = workers(&pool);
    let first = a.prefer(&ws, None, 1.0);
    assert_eq!(
        (first.outcome, first.worker.is_none()),
        (Outcome::Miss, true)
    );
    a.taken(&ws[1], &first, first.outcome);
    let again = a.prefer(&ws, None, 1.0);
    assert_eq!(again.outcome, Outcome::Hit);
    assert!(Arc::ptr_eq(again.worker.as_ref().unwrap(), &ws[1]));
    // A fifth of its KV in use: within 0.25 of the idle ones.
    let fifth = ws[1].start_request_holding(200);
    assert_eq!(a.prefer(&ws, None, 1.0).outcome, Outcome::Hit);
    // Three tenths: past it.
    let more = ws[1].start_request_holding(100);
    let busy = a.prefer(&ws, None, 1.0);
    assert_eq!(
        (busy.outcome, busy.worker.is_none()),
        (Outcome::Balanced, true)
    );
    // … unless the others are as busy.
    let others: Vec<_> = [0, 2]
        .iter()
        .map(|&i| ws[i].start_request_holding(150))
        .collect();
    assert_eq!(a.prefer(&ws, None, 1.0).outcome, Outcome::Hit);
    drop((fifth, more, others));
}

#[tokio::test]
async fn only_workers_that_could_take_the_request_now_are_preferred() {
    let pool = pool(true);
    let routing = routing(1.0);
    let a = affinity(&pool, &routing, "t").await;
    let ws = workers(&pool);
    let first = a.prefer(&ws, None, 1.0);
    a.taken(&ws[0], &first, first.outcome);
    // No room there for 800 tokens: it is not a candidate, even at a margin of 1.0.
    let held = ws[0].start_request_holding(300);
    let within_room = a.prefer(&ws, Some(800), 1.0);
    assert_eq!(within_room.outcome, Outcome::Miss);
    assert_eq!(a.prefer(&ws, Some(700), 1.0).outcome, Outcome::Hit);
    drop(held);
    // Drained: never preferred, and forgotten once back.
    ws[0].set_draining(true);
    assert_eq!(a.prefer(&ws, None, 1.0).outcome, Outcome::Miss);
    ws[0].set_draining(false);
    assert_eq!(a.prefer(&ws, None, 1.0).outcome, Outcome::Miss);
    assert_eq!(pool.prefix.as_ref().unwrap().size().blocks, 0);
}

#[tokio::test]
async fn tenants_share_affinity_only_without_a_salt() {
    for salted in [true, false] {
        let pool = pool(salted);
        let routing = routing(0.25);
        let ws = workers(&pool);
        let one = affinity(&pool, &routing, "one").await;
        let first = one.prefer(&ws, None, 1.0);
        one.taken(&ws[2], &first, first.outcome);
        let two = affinity(&pool, &routing, "two").await;
        let outcome = two.prefer(&ws, None, 1.0).outcome;
        let want = if salted { Outcome::Miss } else { Outcome::Hit };
        assert_eq!(outcome, want, "salted: {salted}");
    }
}

#[tokio::test]
async fn off_without_blocks_or_with_a_short_prompt_means_no_affinity() {
    let pool = pool(true);
    assert!(PrefixRouting::off()
        .affinity(&pool, Some(&blocks()), Some("t"))
        .await
        .is_none());
    assert!(routing(0.25)
        .affinity(&pool, None, Some("t"))
        .await
        .is_none());
    let short = RequestBlocks(Arc::new(Known(Arc::from(Vec::new()))));
    assert!(routing(0.25)
        .affinity(&pool, Some(&short), Some("t"))
        .await
        .is_none());
}
