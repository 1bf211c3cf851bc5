"""An example synthloop domain shipped as its own distribution (``synthloop-bookshop``)."""
