"""What a run tells its user: the status line, TensorBoard and ``summary.json`` (``reporter``), the statistics
behind them (``stats``), the start block (``progress``), and reading TensorBoard files back (``events``)."""
