"""What the cost expressions imply: closed-form limits and the formulas behind them."""
