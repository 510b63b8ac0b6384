"""What runs on a user's machine beside their own clients (``pgplane psql``)."""
