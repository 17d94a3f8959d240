# Sourced by the CLI test scripts. micro_toml FILE DATA_DIR [TRAIN_LINES]
# writes the smallest model that trains on the prepared Brown data (C = 32,
# one layer, B = 2, T = 16, one thread); TRAIN_LINES (a string of TOML
# lines) ends the [train] table and may open further tables.
micro_toml() {
  cat >"$1" <<TOML
[model]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
max_position_embeddings = 32
[data]
dir = "$2"
[train]
batch_size = 2
seq_len = 16
threads = 1
${3:-}
TOML
}
