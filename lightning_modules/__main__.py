"""``python -m lightning_modules {fit,validate,test} --config configs/<benchmark>/<recipe>.yaml``."""

from .cli import main

if __name__ == "__main__":
    main()
