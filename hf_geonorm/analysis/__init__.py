"""A model on real text: perplexity and the reasons for a non-finite one (``evaluation``), the angles each residual
update turns by (``angles``), and the step sizes and frames measured from a Pre-Norm model (``calibration``)."""
