/* placeholder grammar: replaced by the real one */
%define api.pure full
%locations
%expect 0
%code requires { #include "frontend/frontend.h" }
%code { int yylex(YYSTYPE *lval, YYLTYPE *lloc); void yyerror(YYLTYPE *lloc, const char *msg); }
%%
file: %empty ;
%%
