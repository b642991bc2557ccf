//! The cascade pre-check runs the cascade in a second row order only when the first one's outcome
//! could depend on it: a NO ACTION check meeting a referencing row that its own generation of
//! trigger events deleted. A check whose referencing rows went in an earlier generation holds in
//! every order, and one run decides.

use deprov::engine::simulate::{self, Verdict};
use deprov::engine::{Plan, load_plan};
use deprov::sql::QualifiedName;

use crate::harness::{Env, config_hard, env_with_schema, simulated};

/// A card's `home_id` cascades from a board, its `pinned_id` (NO ACTION) references another board
/// of the same account. Account 1's boards lie in the order 10, 20: card 100 goes with board 10's
/// cascade before board 20's check fires. Account 2's lie in the order 40, 30: board 40's check
/// fires while card 300 is still there.
const CONTESTED: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.boards (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.cards (id bigint PRIMARY KEY,
    home_id bigint REFERENCES app.boards ON DELETE CASCADE,
    pinned_id bigint REFERENCES app.boards);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.boards VALUES (10, 1), (20, 1), (40, 2), (30, 2);
INSERT INTO app.cards VALUES (100, 10, 20), (300, 30, 40);
ANALYZE;
";

/// Boards and cards both cascade from the account, and a card's `board_id` (NO ACTION) references
/// a board: the cards go in the same generation as the boards, before any board's check fires.
const UNCONTESTED: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.boards (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.cards (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    board_id bigint REFERENCES app.boards);
INSERT INTO app.accounts VALUES (1, NULL);
INSERT INTO app.boards VALUES (10, 1), (20, 1);
INSERT INTO app.cards VALUES (100, 1, 10), (200, 1, 20);
ANALYZE;
";

/// A target holding `schema`, and the plan of `app.accounts` (which needs the pre-check).
async fn planned(schema: &str) -> (Env, Plan) {
    let env = env_with_schema(&config_hard("", "id", ""), schema).await;
    let plan = load_plan(&env.db, &QualifiedName::new("app", "accounts"), "id")
        .await
        .unwrap();
    assert!(simulate::needs_simulation(&plan));
    (env, plan)
}

/// The SQLSTATE of the account's cascading `DELETE` (rolled back), or `None` when it succeeds.
async fn cascade_error(env: &Env, account: i64) -> Option<String> {
    crate::harness::cascade_error(env, account)
        .await
        .map(|(code, _)| code)
}

#[tokio::test]
async fn a_check_that_meets_a_row_its_own_generation_deleted_is_run_in_both_orders() {
    let (env, plan) = planned(CONTESTED).await;
    // The same schema and rows but for their physical order: PostgreSQL's cascade succeeds for
    // one account and fails for the other.
    assert_eq!(cascade_error(&env, 1).await, None);
    assert_eq!(cascade_error(&env, 2).await.as_deref(), Some("23503"));
    // The first order succeeds for account 1, and the pre-check still finds the other.
    for account in ["1", "2"] {
        let verdict = simulated(&env, &plan, account).await;
        assert!(
            matches!(verdict, Verdict::OrderDependent(ref f) if f.constraint == "cards_pinned_id_fkey"),
            "account {account}: {verdict:?}"
        );
    }
}

#[tokio::test]
async fn a_check_whose_referencing_rows_went_in_an_earlier_generation_needs_one_order() {
    let (env, plan) = planned(UNCONTESTED).await;
    assert_eq!(cascade_error(&env, 1).await, None);
    let verdict = simulated(&env, &plan, "1").await;
    // The account and its two boards; one order decided. The cards go in the first generation,
    // before any board's check fires, so they are not read at all.
    assert_eq!(
        verdict,
        Verdict::Succeeds {
            rows_read: 3,
            row_orders: 1
        }
    );
}
