"""The defaults of the measures on text, declared once for the library and the command line."""

# Tokens of a text that perplexity is measured on: `perplexity --max-tokens`, `convert --eval-tokens` (before and
# after the conversion) and their library calls, so that their numbers compare.
PERPLEXITY_TOKENS = 2048
# Tokens of a text the angles of the residual updates are measured on (`angles --max-tokens`, ``analyse_angles``).
ANGLE_TOKENS = 1024
