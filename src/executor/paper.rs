//! The built-in simulated fill: the first run works without an exchange, and benchmarks measure
//! the gateway rather than a network.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Number;

use super::{Order, Outcome, classify};

/// Fills every order at once, in full. Its answers go through the same `classify` as a real
/// executor's, so the gateway cannot tell the difference.
#[derive(Debug, Default)]
pub struct Paper {
    orders: AtomicU64,
}

impl Paper {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn execute(&self, order: &Order) -> Outcome {
        // The gateway only forwards validated trades, so a body without a quantity is a caller
        // bug; answer it as an exchange would (a 400), never with a fill.
        #[derive(Deserialize)]
        struct Trade {
            quantity: Option<Number>,
        }
        // serde would also fill the struct from an array, by position: only an object is a
        // trade. The gateway forwards the body as it was sent, so whitespace may come first.
        let quantity = if order.body.trim_ascii_start().starts_with(b"{") {
            serde_json::from_slice::<Trade>(&order.body)
                .ok()
                .and_then(|t| t.quantity)
        } else {
            None
        };
        let answer = match quantity {
            Some(filled) => {
                let n = self.orders.fetch_add(1, Ordering::Relaxed) + 1;
                serde_json::to_vec(&Fill {
                    filled,
                    idempotency_key: &order.key,
                    order_id: format!("paper-{n}"),
                    simulated: true,
                    success: true,
                })
                .map(|body| (200, body))
            }
            None => serde_json::to_vec(&Refusal {
                error: "trade has no numeric quantity",
                simulated: true,
                success: false,
            })
            .map(|body| (400, body)),
        };
        match answer {
            Ok((status, body)) => classify(status, Bytes::from(body)),
            // Plain structs of strings and numbers always serialise.
            Err(e) => Outcome::NotSent(format!("paper fill could not be written: {e}")),
        }
    }
}

/// A fill, as an exchange adapter answers one.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Fill<'a> {
    filled: Number,
    idempotency_key: &'a str,
    order_id: String,
    simulated: bool,
    success: bool,
}

#[derive(Serialize)]
struct Refusal {
    error: &'static str,
    simulated: bool,
    success: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn order(key: &str, body: &str) -> Order {
        Order {
            key: key.into(),
            request_id: "req-1".into(),
            body: Bytes::from(body.to_owned()),
        }
    }

    fn success_body(outcome: Outcome) -> Value {
        match outcome {
            Outcome::Success { status: 200, body } => serde_json::from_slice(&body).unwrap(),
            other => panic!("expected a 200 success, got {other:?}"),
        }
    }

    #[test]
    fn fills_the_quantity_and_echoes_the_key() {
        let paper = Paper::new();
        let answer = success_body(paper.execute(&order(
            "k-1",
            r#"{"exchange":"binance","symbol":"BTCUSDT","action":"LONG","quantity":0.25}"#,
        )));
        assert_eq!(answer["success"], true);
        assert_eq!(answer["simulated"], true);
        assert_eq!(answer["idempotencyKey"], "k-1");
        assert_eq!(answer["filled"], 0.25);
        assert_eq!(answer["orderId"], "paper-1");
    }

    /// The body reaches the executor as the sender wrote it: pretty-printed, or after a
    /// newline, it is still a trade.
    #[test]
    fn a_body_with_whitespace_before_it_is_filled() {
        let paper = Paper::new();
        let answer = success_body(paper.execute(&order("k", " \r\n\t{ \"quantity\" : 3 }\n")));
        assert_eq!(answer["filled"], 3);
    }

    #[test]
    fn order_ids_are_distinct() {
        let paper = Paper::new();
        let ids: Vec<Value> = (0..3)
            .map(|i| success_body(paper.execute(&order(&format!("k-{i}"), r#"{"quantity":1}"#))))
            .map(|a| a["orderId"].clone())
            .collect();
        assert_eq!(ids, ["paper-1", "paper-2", "paper-3"]);
    }

    #[test]
    fn no_quantity_is_a_failure_not_a_fill() {
        let paper = Paper::new();
        for body in [
            r#"{"symbol":"X"}"#,
            r#"{"quantity":"1"}"#,
            r#"{"quantity":null}"#,
            "not json",
            "[]",
            "[5]",
            " \n[5]",
        ] {
            match paper.execute(&order("k", body)) {
                Outcome::Failed { status: 400, .. } => {}
                other => panic!("{body}: expected Failed 400, got {other:?}"),
            }
        }
        // A refused order consumes no order id.
        let answer = success_body(paper.execute(&order("k", r#"{"quantity":2}"#)));
        assert_eq!(answer["orderId"], "paper-1");
    }
}
