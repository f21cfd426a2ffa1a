"""Generative models (causal language models): mlms-nb's own generate loop over a framework's step model, with
MLPerf's latency definitions (TTFT, TPOT, inter-token latency) and the offline and server scenarios."""
