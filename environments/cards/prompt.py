"""The card games' task descriptions (this project's wording; the prompt itself is TextEnv's default template)."""

__all__ = ["BLACKJACK_TASK", "EZPOINTS_TASK", "NUMBERLINE_TASK"]

EZPOINTS_TASK = (
    "Build a formula worth {target} from the two cards shown, one symbol per move. A move appends a card's number, "
    "'+' or '*' to the formula, or '=' to finish and score it. An ace counts 1; J, Q and K count 10. Use each card "
    "exactly once; a number that no unused card shows changes nothing. Finishing with a formula worth {target} that "
    "uses both cards scores {reward:g}; any other finish scores 0."
)

NUMBERLINE_TASK = (
    "A marker stands on a number line from 0 to {max_position}. Move it onto the target: '+' adds one to the current "
    "number, '-' takes one away. A move that does not bring it closer costs 1; reaching the target scores 1."
)

BLACKJACK_TASK = (
    "Play one hand of blackjack against the dealer, who shows one card and keeps one face down. 'hit' takes "
    "another card; 'stand' ends your turn, and the dealer then draws until their total is 17 or more. Cards 2-10 "
    "count their number, J, Q and K count 10, an ace 11 unless that takes the total over 21 (then 1). Over 21 "
    "loses at once. You win 1 when your total beats the dealer's (or the dealer goes over 21); a loss or a tie "
    "gives 0."
)
