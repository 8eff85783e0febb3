"""The praxis_lite layers: each module holds one family of layers."""
